"""Fixtures that build the real image with podman and run it as SageMaker would.

Everything here skips, with the reason, when podman is missing or cannot run
containers on this machine (scripts/setup_podman.sh installs and configures it).

Environment:
  SMSERVE_TEST_BASE_IMAGE  an image to build on instead of making one with debootstrap
                           (e.g. python:3.11-slim-bookworm where a registry answers)
  TORCH_WHEEL_DIR          a directory holding the torch CPU wheel (also searched:
                           PIP_FIND_LINKS); without one the build downloads torch from
                           the PyTorch CPU index

The images are tagged localhost/sagemaker-pytorch-byoc:test-<key> and :test-compiler-<key>,
one tag per set of build inputs (support.image_key), kept for the next session; those of
sources since changed are no longer used (`podman rmi` them to free their layers).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path

import pytest

from tests.container.support import (
    BASE_IMAGE,
    BUILD_TIMEOUT_S,
    ENGINE,
    IMAGE,
    REPO,
    Container,
    image_key,
    last_line,
    local_torch_wheel_dir,
    podman_problem,
    run,
    torch_version,
)


@pytest.fixture(scope="session")
def podman() -> str:
    problem = podman_problem()
    if problem:
        pytest.skip(problem)
    return ENGINE


@contextlib.contextmanager
def one_build_at_a_time():
    """Each pytest-xdist worker (`make test`) that runs an image test asks for the images
    for its own session: one at a time, so the second finds the first's tag and builds
    nothing (build_image)."""
    lock = REPO / "build" / ".container-tests.lock"
    lock.parent.mkdir(exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def base_image(podman) -> str:
    with one_build_at_a_time():
        return _base_image(podman)


def _base_image(podman: str) -> str:
    image = os.environ.get("SMSERVE_TEST_BASE_IMAGE")
    if not image:
        image = BASE_IMAGE
        exists = run([podman, "image", "exists", image]).returncode == 0
        if not exists and (os.geteuid() != 0 or shutil.which("debootstrap") is None):
            pytest.skip("making the base image needs root and debootstrap; "
                        "or set SMSERVE_TEST_BASE_IMAGE to a Python 3.11 Debian image")
        made = run([str(REPO / "scripts" / "make_base_image.sh"), image], timeout=BUILD_TIMEOUT_S)
        if made.returncode != 0:
            # debootstrap needs a Debian mirror: a machine that cannot reach one cannot
            # make the base, which says nothing about the project's image.
            pytest.skip(f"cannot make the base image (scripts/make_base_image.sh): {last_line(made.stderr)}")
    # Building and running are separate abilities: some sandboxes pull and build but
    # cannot start a container at all. That is the machine, not the project.
    smoke = run([podman, "run", "--rm", image, "python3", "-c", "pass"], timeout=300)
    if smoke.returncode != 0:
        pytest.skip(f"podman cannot run containers here: {last_line(smoke.stderr)}")
    return image


@pytest.fixture(scope="session")
def image(podman, base_image) -> str:
    """The project's image, built from the Dockerfile as users build it, except for the
    base and a CPU torch (the CUDA default is several GB, and there is no GPU here).
    Layers are cached, so a rerun rebuilds only what changed in container/; with nothing
    changed the image made before is used as it is (image_key)."""
    return build_image(podman, base_image, "test")


@pytest.fixture(scope="session")
def compiler_image(podman, base_image, image) -> str:
    """The image built with --build-arg COMPILER=true (`make build COMPILER=true`). It
    shares the base and venv layers of `image`, so it costs one apt-get install."""
    return build_image(podman, base_image, "test-compiler", ["--build-arg", "COMPILER=true"])


def build_image(podman: str, base_image: str, name: str, extra_args: list[str] = ()) -> str:
    """IMAGE:name-<key>, a tag for these build inputs alone: a checkout with other
    sources (another worktree, a concurrent run) builds and runs its own image."""
    version = torch_version()
    args = ["--build-arg", f"BASE_IMAGE={base_image}", *extra_args]
    wheel_dir = local_torch_wheel_dir(version)
    if wheel_dir:
        # The exact local version makes pip take the wheel on disk; the index still
        # serves torch's small dependencies.
        args += [
            "--build-arg", f"TORCH_VERSION={version}+cpu",
            "--build-arg", "TORCH_INDEX_URL=" + os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple"),
            "--build-arg", f"TORCH_FIND_LINKS={wheel_dir}",
            "--volume", f"{wheel_dir}:{wheel_dir}:ro",
        ]
    else:
        args += [
            "--build-arg", f"TORCH_VERSION={version}",
            "--build-arg", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu",
        ]
    with one_build_at_a_time():
        base_id = run([podman, "image", "inspect", "--format", "{{.Id}}", base_image]).stdout.strip()
        key = image_key(args, base_id) if base_id else None
        tag = f"{IMAGE}:{name}-{key or 'unkeyed'}"
        if key and run([podman, "image", "exists", tag]).returncode == 0:
            return tag
        built = run([podman, "build", "--tag", tag, *args, str(REPO)], timeout=BUILD_TIMEOUT_S)
    if built.returncode != 0:
        pytest.fail(f"podman build failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}")
    return tag


@pytest.fixture
def start_container(podman, image):
    """Starts containers of the image and removes them after the test."""
    started: list[Container] = []

    def start(model_dir: Path, env: dict[str, str] | None = None) -> Container:
        container = Container(podman, image, model_dir, env).start()
        started.append(container)
        container.wait_ready()
        return container

    yield start
    for container in started:
        container.close()


@pytest.fixture(scope="session")
def serving(podman, image, example_model_dir):
    """The example model served from the image, shared by the read-only tests of every
    module (those that only send it requests): each start costs a gunicorn, torch and
    the model's load and warm-up inside the container."""
    container = Container(podman, image, example_model_dir).start()
    try:
        container.wait_ready()
        yield container
    finally:
        container.close()
