#!/usr/bin/env bash
# Regenerates the lock files from the top-level pins (`make lock`; needs PyPI and uv,
# which `make lock` installs into the venv).
#
#   image.txt           container/requirements.txt + torch, as PyPI serves it (CUDA 13)
#   image-no-torch.txt  the same less torch and its CUDA wheels, for a torch from elsewhere
#   dev.txt             requirements-dev.txt + torch, as PyPI serves it (CUDA 13)
#   dev-no-torch.txt    the same less torch and its CUDA wheels
#   uv.txt              uv alone (its pin in requirements-dev.txt): pip installs it first,
#                       and it installs the rest
#
# Every package is pinned with PyPI's sha256 hashes, for Linux x86_64 and Python 3.11
# (the image's and the CI's). torch is left out of the *-no-torch files: its CPU build
# is not on PyPI, and a hash names one file, so the PyTorch index's wheel and a copy in
# a local wheel folder need not agree. Installs pin that torch by version instead.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
torch=$(sed -n 's/^torch==//p' requirements-dev.txt)
# Only PyPI: no pip.conf or uv.toml index may lend a file whose hash PyPI lacks.
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_CONSTRAINT UV_INDEX_URL UV_EXTRA_INDEX_URL UV_FIND_LINKS
common=(--quiet --no-config --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28
        --index-url https://pypi.org/simple --no-emit-index-url --custom-compile-command "make lock")
# torchvision as built for that torch (the resolver picks the release that pins it): in
# image.txt only, since PyPI's torchvision imports beside PyPI's torch alone, not beside
# the CPU or CUDA 12 builds the *-no-torch installs take from other indexes.
printf -- '# Written by lock/compile.sh: the image lock'"'"'s input.\n-r ../container/requirements.txt\ntorch==%s\ntorchvision\n' "$torch" > lock/image.in
compile() {  # OUTPUT INPUT [options...]
    echo "lock: $1" >&2
    "$UV" pip compile "${common[@]}" "${@:3}" --output-file "$1" "$2"
}
# Without torch: its CPU build depends on none of the nvidia-* / triton wheels, so
# those are named here (every dependency the CUDA build adds) and left out too.
# dev first: the tests' set is the more constrained (tritonclient caps greenlet), and
# the image then takes the very versions the tests ran.
compile lock/dev.txt requirements-dev.txt
sed -n '/^uv==/p' requirements-dev.txt | compile lock/uv.txt - -c lock/dev.txt
compile lock/image.txt lock/image.in -c lock/dev.txt
no_torch=(--no-emit-package torch --no-emit-package torchvision)
for p in $(sed -En 's/^(nvidia-[a-z0-9-]*|triton|cuda-[a-z0-9-]*)(\[[^]]*\])?==.*/\1/p' lock/dev.txt | sort -u); do
    no_torch+=(--no-emit-package "$p")
done
compile lock/image-no-torch.txt lock/image.in -c lock/dev.txt "${no_torch[@]}"
compile lock/dev-no-torch.txt requirements-dev.txt -c lock/dev.txt "${no_torch[@]}"
