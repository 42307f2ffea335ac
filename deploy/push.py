"""push: a local image into ECR, answered with the pushed image's digest URI."""

from __future__ import annotations

import base64
import subprocess
from dataclasses import dataclass
from typing import Callable, Sequence
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from deploy.aws import Aws, DeployError, error_code, say
from deploy.endpoint import check_manifest_type


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


# The container engine is reached through a runner so tests can see the exact commands
# (and no real registry is needed there). `input` feeds the password on stdin: it must
# never appear on a command line, where `ps` would show it.
Runner = Callable[[Sequence[str], bytes | None], Completed]


def subprocess_runner(argv: Sequence[str], input: bytes | None = None) -> Completed:
    try:
        done = subprocess.run(list(argv), input=input, capture_output=True, timeout=3600)
    except FileNotFoundError:
        return Completed(127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return Completed(124, "", f"{' '.join(argv[:2])} timed out")
    return Completed(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))


def choose_engine(runner: Runner, requested: str | None) -> str:
    """docker if its daemon answers, else podman; --engine skips the probe."""
    if requested:
        return requested
    for engine in ("docker", "podman"):
        if runner([engine, "info"], None).returncode == 0:
            return engine
    raise DeployError("no container engine answers (`docker info` and `podman info` both failed); start one or pass --engine")


def split_reference(image: str) -> tuple[str, str]:
    """'registry:5000/team/name:tag' -> ('name', 'tag'); the tag defaults to 'latest'."""
    without_digest = image.split("@", 1)[0]
    last = without_digest.rsplit("/", 1)[-1]
    name, _, tag = last.partition(":")
    return name, tag or "latest"


def ensure_repository(aws: Aws, name: str) -> str:
    """The repository's URI, creating the repository if it is missing."""
    ecr = aws.client("ecr")
    try:
        repository = ecr.describe_repositories(repositoryNames=[name])["repositories"][0]
    except ClientError as error:
        if error_code(error) != "RepositoryNotFoundException":
            raise
        say(f"creating ECR repository {name}")
        repository = ecr.create_repository(
            repositoryName=name,
            # Scanning on push is free for basic scanning and reports CVEs in the base image.
            imageScanningConfiguration={"scanOnPush": True},
        )["repository"]
    return repository["repositoryUri"]


def registry_login(aws: Aws) -> tuple[str, str, str]:
    """(registry host, user, password) from ecr:GetAuthorizationToken (valid 12 hours)."""
    data = aws.client("ecr").get_authorization_token()["authorizationData"][0]
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    endpoint = data["proxyEndpoint"]
    host = urlparse(endpoint).netloc or endpoint  # podman wants the bare host
    return host, user, password


def push(aws: Aws, image: str, repository: str | None, tag: str | None, engine: str | None, runner: Runner = subprocess_runner) -> str:
    """Tag and push `image`; returns 'repo-uri@sha256:...' as SageMaker should be given it."""
    default_name, default_tag = split_reference(image)
    repository = repository or default_name
    tag = tag or default_tag
    engine = choose_engine(runner, engine)

    def run(argv: list[str], input: bytes | None = None, what: str = "") -> Completed:
        done = runner(argv, input)
        if done.returncode != 0:
            detail = _last_line(done.stderr) or _last_line(done.stdout) or f"exit status {done.returncode}"
            raise DeployError(f"{what or ' '.join(argv[:2])} failed: {detail}")
        return done

    if runner([engine, "image", "inspect", image], None).returncode != 0:
        raise DeployError(f"image {image} not found by {engine} (`{engine} image inspect` failed); build it first (make build)")
    uri = ensure_repository(aws, repository)
    host, user, password = registry_login(aws)
    run([engine, "login", "--username", user, "--password-stdin", host], password.encode(), what=f"{engine} login to {host}")
    target = f"{uri}:{tag}"
    run([engine, "tag", image, target])
    say(f"pushing {target}")
    # podman pushes OCI manifests unless told otherwise, and SageMaker rejects those;
    # v2s2 is Docker's schema 2, which it takes. (docker pushes what it built: see make build.)
    run([engine, "push", *(["--format", "v2s2"] if engine == "podman" else []), target], what=f"{engine} push {target}")
    return f"{uri}@{image_digest(aws, repository, tag, image)}"


def image_digest(aws: Aws, repository: str, tag: str, local_image: str) -> str:
    try:
        details = aws.client("ecr").describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])["imageDetails"]
    except ClientError as error:
        if error_code(error) in ("ImageNotFoundException", "RepositoryNotFoundException"):
            raise DeployError(f"the push finished but ECR has no image {repository}:{tag}") from None
        raise
    # Found now rather than at create-model, where SageMaker would refuse it.
    check_manifest_type(local_image, details[0])
    return details[0]["imageDigest"]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
