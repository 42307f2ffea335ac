#!/usr/bin/env python3
"""Runs AWS's PyTorch inference toolkit's own local integration tests against this image.

    python local_test/toolkit_tests.py TOOLKIT_CHECKOUT IMAGE [pytest args...]

TOOLKIT_CHECKOUT is a checkout of aws/sagemaker-pytorch-inference-toolkit (its test/
folder is read, never changed: the tests run from a copy in a temporary folder). IMAGE
is this project's image, e.g. localhost/smserve-toolkit:cpu-test (built as
tests/container builds it). Run with a Python that has the SageMaker Python SDK (2.x),
pytest, sagemaker-inference, torch, moto and, where no Docker daemon runs, podman-compose.

The tests run as the toolkit's CI runs them (`pytest test/integration/local -vv -rA -s
--docker-base-name ... --tag ...`, SDK local mode), with these changes, each because
something here differs from AWS's build hosts, never to bend an assertion:

- test_mnist_serving.py: the MNIST test set (downloaded by torchvision, not in the
  repository) is replaced by random tensors of its shape, (300, 1, 28, 28).
- The resnet18 TorchScript files (too large for the repository snapshot) are made here:
  a ResNet-18 of torchvision's layout (model/image/resnet.py) with random weights,
  scripted as model.pt and traced as traced_resnet18.pt. The tests check 1000 scores.
- test_multi_model_endpoint_local.py: `-e SMSERVE_MODELS_ROOT=/` in its `docker run`
  (it mounts the models at /resnet18 and /traced_resnet18, outside /opt/ml/models), and
  the cat picture it downloads is a JPEG made locally (no network to that host here).
- The resnet18 scripts import torchvision.transforms, which an image built with the CPU
  torch has not (PyPI's torchvision does not import beside it): a stand-in package
  `torchvision` with the five transforms they use (Resize, CenterCrop, ToTensor,
  Normalize, Compose; Pillow and torch) is put in their code/ folders. The scripts
  themselves are unchanged. An image built with PyPI's torch needs none of it
  (--real-torchvision leaves it out).
- The SDK repacks the model with its script through S3 (the default bucket, found
  with STS) even in local mode; without AWS here, both are moto's in-process stand-ins
  (a pytest plugin written into the working copy; --real-aws leaves it out).
- Where no Docker daemon answers but podman works, `docker` and `docker-compose` that
  run podman and podman-compose are put first on PATH, for the SDK and the tests.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TORCHVISION_STANDIN = '''"""Stand-in for torchvision.transforms (the few the toolkit's resnet18 scripts use)."""
import numpy as np
import torch
from PIL import Image


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class Resize:
    """The shorter side to `size`, keeping the aspect ratio, bilinear."""

    def __init__(self, size):
        self.size = size

    def __call__(self, img):
        w, h = img.size
        if w <= h:
            return img.resize((self.size, int(self.size * h / w)), Image.BILINEAR)
        return img.resize((int(self.size * w / h), self.size), Image.BILINEAR)


class CenterCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, img):
        w, h = img.size
        left, top = int(round((w - self.size) / 2.0)), int(round((h - self.size) / 2.0))
        return img.crop((left, top, left + self.size, top + self.size))


class ToTensor:
    def __call__(self, img):
        array = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
        return torch.from_numpy(array).permute(2, 0, 1).contiguous()


class Normalize:
    def __init__(self, mean, std):
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std
'''

AWS_STAND_IN = '''"""S3 and STS for the SDK's repack, in process (moto), with made-up credentials."""
import os

for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                   "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-west-2"}.items():
    os.environ[key] = value

from moto import mock_aws  # noqa: E402

_mock = mock_aws()


def pytest_configure(config):
    _mock.start()


def pytest_unconfigure(config):
    _mock.stop()
'''

RANDOM_LOADER = '''def _get_test_data_loader(batch_size):
    # Random tensors of the MNIST test set's shape and normalisation (the data set is
    # downloaded by torchvision, which is not available here).
    images = torch.randn(batch_size * 2, 1, 28, 28)
    labels = torch.randint(0, 10, (batch_size * 2,))
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels), batch_size=batch_size, shuffle=True)
'''


def replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        sys.exit(f"toolkit_tests: {path} has changed: {old!r} not found; adapt this script")
    path.write_text(text.replace(old, new))


def adapt_mnist_test(path: Path) -> None:
    replace(path, "from torchvision import datasets, transforms\n", "")
    text = path.read_text()
    start = text.index("def _get_test_data_loader(batch_size):")
    end = text.index("def _get_mnist_batch(test_loader):")
    path.write_text(text[:start] + RANDOM_LOADER + "\n\n" + text[end:])


def adapt_mme_test(path: Path, jpeg: Path) -> None:
    replace(path, '"-e SAGEMAKER_MULTI_MODEL=true {} serve"',
            '"-e SAGEMAKER_MULTI_MODEL=true -e SMSERVE_MODELS_ROOT=/ {} serve"')
    replace(path, "img_data = requests.get(image_url).content",
            f"img_data = open({str(jpeg)!r}, 'rb').read()")


def make_resnet_files(resources: Path) -> None:
    """The TorchScript files the repository holds but its snapshot may lack."""
    sys.path.insert(0, str(REPO / "model" / "image"))
    import torch
    from resnet import ResNet18

    torch.manual_seed(0)
    model = ResNet18().eval()
    example = torch.randn(1, 3, 224, 224)
    for rel in ("mme/resnet18/model.pt", "resnet18/default_model/model.pt"):
        target = resources / rel
        if not target.exists() or target.stat().st_size < 1000:
            torch.jit.script(model).save(str(target))
    for rel in ("mme/traced_resnet18/traced_resnet18.pt", "resnet18/default_traced_resnet/traced_resnet18.pt"):
        target = resources / rel
        if not target.exists() or target.stat().st_size < 1000:
            with torch.no_grad():
                torch.jit.trace(model, example).save(str(target))


def make_jpeg(path: Path) -> None:
    from PIL import Image
    import numpy as np

    pixels = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    path.write_bytes(buffer.getvalue())


def docker_works() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, timeout=60).returncode == 0


def docker_shim(bin_dir: Path) -> None:
    """`docker` and `docker-compose` that run podman and podman-compose, first on PATH,
    where no Docker daemon answers but podman works."""
    if docker_works() or not shutil.which("podman"):
        return
    compose = shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")
    (bin_dir / "docker").write_text(
        "#!/bin/bash\n"
        f'if [ "$1" = compose ]; then shift; exec {compose} "$@"; fi\n'
        # The SDK reads a remote Docker host from the context, else uses localhost.
        'if [ "$1" = context ]; then echo "podman: no docker context" >&2; exit 1; fi\n'
        'exec podman "$@"\n')
    (bin_dir / "docker-compose").write_text(f'#!/bin/bash\nexec {compose} "$@"\n')
    for shim in ("docker", "docker-compose"):
        (bin_dir / shim).chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("toolkit", type=Path)
    parser.add_argument("image", help="REPOSITORY:TAG")
    parser.add_argument("--real-torchvision", action="store_true",
                        help="the image has torchvision: no stand-in in the resnet18 scripts' code/")
    parser.add_argument("--real-aws", action="store_true",
                        help="use the AWS account in the environment for the SDK's S3 (as AWS's CI does)")
    parser.add_argument("--keep", action="store_true", help="keep the working copy (its path is printed)")
    args, pytest_args = parser.parse_known_args()

    source = args.toolkit / "test"
    if not (source / "integration" / "local").is_dir():
        sys.exit(f"toolkit_tests: {source}/integration/local not found")
    repository, _, tag = args.image.rpartition(":")
    if not repository:
        sys.exit("toolkit_tests: IMAGE must be REPOSITORY:TAG")

    work = Path(tempfile.mkdtemp(prefix="toolkit-tests-"))
    try:
        tests = work / "test"
        shutil.copytree(source, tests)
        resources = tests / "resources"
        make_resnet_files(resources)
        jpeg = work / "cat.jpg"
        make_jpeg(jpeg)
        adapt_mnist_test(tests / "integration" / "local" / "test_mnist_serving.py")
        adapt_mme_test(tests / "integration" / "local" / "test_multi_model_endpoint_local.py", jpeg)
        if not args.real_torchvision:
            for code in ("mme/resnet18/code", "mme/traced_resnet18/code"):
                package = resources / code / "torchvision"
                package.mkdir(exist_ok=True)
                (package / "__init__.py").write_text("")
                (package / "transforms.py").write_text(TORCHVISION_STANDIN)
        bin_dir = work / "bin"
        bin_dir.mkdir()
        docker_shim(bin_dir)
        plugins = []
        if not args.real_aws:
            (work / "toolkit_aws_stand_in.py").write_text(AWS_STAND_IN)
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(work), os.environ.get("PYTHONPATH")]))
            plugins = ["-p", "toolkit_aws_stand_in"]
        print(f"toolkit_tests: running in {work}", flush=True)
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugins, "test/integration/local",
                   "-vv", "-rA", "-s", "--docker-base-name", repository, "--tag", tag, "--processor", "cpu",
                   *pytest_args]
        print("toolkit_tests: " + " ".join(command), flush=True)
        # The tests write files (cat.jpg) into the working directory: the copy's.
        return subprocess.call(command, cwd=work)
    finally:
        if args.keep:
            print(f"toolkit_tests: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
