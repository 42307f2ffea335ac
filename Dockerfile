# A SageMaker bring-your-own-container image for PyTorch models.
#
#   docker build -t sagemaker-pytorch-byoc .            (CUDA torch; runs on CPU too)
#   docker run -p 8080:8080 -v "$PWD/build/model:/opt/ml/model:ro" sagemaker-pytorch-byoc serve
#
# The model is not baked in: SageMaker unpacks model.tar.gz into /opt/ml/model at run
# time. The NVIDIA driver is not inside either: the host's container toolkit mounts it,
# and the CUDA runtime libraries come with the torch wheels.

# Any Debian-based image with Python 3.11 on PATH as python3 works (the tests use a
# locally made bookworm image, whose python3 is /usr/bin/python3, not /usr/local/bin).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS builder

# torch's pin is requirements-dev.txt's (`make build` passes it as TORCH_VERSION).
# With the default index, PyPI (torch 2.13.0 for Linux x86_64 is the CUDA 13.0 build;
# the host needs NVIDIA driver 580 or newer), torch and its CUDA wheels come from
# lock/image.txt with everything else, every file hash-checked. With another index (a
# CUDA 12 build for older drivers, e.g. https://download.pytorch.org/whl/cu128; the CPU
# build, about 1 GB instead of several, https://download.pytorch.org/whl/cpu) or local
# wheels, torch is pinned by version only: a hash names one file, and those files are
# not PyPI's (lock/README.md). The rest then comes from lock/image-no-torch.txt, hashed.
# torchvision (what scripts made for AWS's PyTorch containers import) comes with PyPI's
# torch only, and the build fails if it does not import: PyPI's torchvision is built for
# PyPI's torch, and does not import beside a torch from another index (the CPU build).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
# A directory of local wheels (mounted into the build with -v) searched with the index.
ARG TORCH_FIND_LINKS=

# One layer: the lock changes only when a pin does, and then torch's layer would be
# rebuilt anyway. --no-deps: each lock is complete; pip check proves the set consistent.
COPY lock/image.txt lock/image-no-torch.txt /tmp/lock/
RUN python3 -m venv /opt/venv \
    && if [ "${TORCH_INDEX_URL}" = "https://pypi.org/simple" ] && [ -z "${TORCH_FIND_LINKS}" ]; then \
        /opt/venv/bin/pip install --no-cache-dir --require-hashes --no-deps -r /tmp/lock/image.txt \
        && /opt/venv/bin/python -c "import torchvision" ; \
    else \
        /opt/venv/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" \
            ${TORCH_FIND_LINKS:+--find-links "${TORCH_FIND_LINKS}"} "torch==${TORCH_VERSION}" \
        && /opt/venv/bin/pip install --no-cache-dir --require-hashes --no-deps -r /tmp/lock/image-no-torch.txt; \
    fi \
    && /opt/venv/bin/pip check

FROM ${BASE_IMAGE}

# SageMaker runs the container as root and expects it: no USER switch (the model
# directory and /opt/ml are mounted root-owned).
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

COPY --from=builder /opt/venv /opt/venv

# SMSERVE_COMPILE (torch.compile) compiles at run time: inductor builds CPU kernels with
# g++ and triton builds its GPU kernel launchers with gcc, both against Python's headers.
# The image leaves build tools out unless built with --build-arg COMPILER=true (`make
# build COMPILER=true`, about 300 MB more); without them SMSERVE_COMPILE logs why it
# failed and serves the model uncompiled. After the venv, which both variants share,
# and before container/, so a code change rebuilds neither. python3-dev only where the
# base lacks the headers (Debian's python3 does; the python: images ship them). Debian's
# packages are not pinned: the mirror keeps only the current point release, so a pin
# would break the build at the next one.
ARG COMPILER=false
# hadolint ignore=DL3008
RUN if [ "${COMPILER}" = true ]; then \
        headers=$(python3 -c 'import os, sysconfig; print(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))') \
        && set -- g++ libc6-dev \
        && if [ "${headers}" != True ]; then set -- "$@" python3-dev; fi \
        && apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" \
        && apt-get clean && rm -rf /var/lib/apt/lists/*; \
    elif [ "${COMPILER}" != false ]; then \
        echo "COMPILER must be true or false, not '${COMPILER}'" >&2; exit 1; \
    fi

COPY container/ /opt/program/

WORKDIR /opt/program

EXPOSE 8080
# The server honours SAGEMAKER_BIND_TO_PORT, so SageMaker may run it beside other
# containers (inference pipelines, multi-container endpoints) on another port.
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true
# SageMaker's bidirectional streaming API routes WebSocket sessions to /invocations-bidirectional-stream (8080) only with this label.
LABEL com.amazonaws.sagemaker.capabilities.bidirectional-streaming=true
# The same image serves a multi-model endpoint (SAGEMAKER_MULTI_MODEL=true: the /models API).
LABEL com.amazonaws.sagemaker.capabilities.multi-models=true

# Exec form without a shell or an init: `serve` execs gunicorn, which becomes PID 1
# and so receives SageMaker's SIGTERM itself. SageMaker passes `serve` as the argument.
ENTRYPOINT ["/opt/program/serve"]
