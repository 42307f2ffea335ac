"""push: a local image into ECR or a private registry, answered with the pushed image's digest URI."""

from __future__ import annotations

import base64
import codecs
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from deploy.aws import Aws, DeployError, error_code, say
from deploy.model import check_manifest_type


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


# The container engine is reached through a runner so tests can see the exact commands
# (and no real registry is needed there). `input` feeds the password on stdin: it must
# never appear on a command line, where `ps` would show it. `progress`: relay what the
# engine prints to stderr as it prints it (a push of a 5 GB image takes minutes).
Runner = Callable[..., Completed]

# What is kept of a relayed engine's output, for the error line and the digest.
_TAIL_BYTES = 16384


def subprocess_runner(argv: Sequence[str], input: bytes | None = None, progress: bool = False) -> Completed:
    if progress:
        return _relayed(argv, input)
    try:
        done = subprocess.run(list(argv), input=input, capture_output=True, timeout=3600)
    except FileNotFoundError:
        return Completed(127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return Completed(124, "", f"{' '.join(argv[:2])} timed out")
    return Completed(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))


def _relayed(argv: Sequence[str], input: bytes | None) -> Completed:
    """Run argv with its stdout and stderr copied to our stderr as they come.

    Our stdout stays the command's result. The engine sees a pipe, not a terminal, so
    it prints a line per layer step instead of redrawing bars; those lines arrive here
    as the push goes. The tail is kept: its last line is the error when it fails.
    """
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except FileNotFoundError:
        return Completed(127, "", f"{argv[0]}: command not found")
    if input is not None:
        proc.stdin.write(input)
        proc.stdin.close()
    text = codecs.getincrementaldecoder("utf-8")("replace")
    tail = ""
    try:
        while chunk := proc.stdout.read1(65536):
            piece = text.decode(chunk)
            sys.stderr.write(piece)
            sys.stderr.flush()
            tail = (tail + piece)[-_TAIL_BYTES:]
    finally:
        returncode = proc.wait()  # on Ctrl-C too: the engine got the same SIGINT
    return Completed(returncode, tail, "")


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

    run = _checked(runner)
    _check_local_image(runner, engine, image)
    uri = ensure_repository(aws, repository)
    host, user, password = registry_login(aws)
    run([engine, "login", "--username", user, "--password-stdin", host], password.encode(), what=f"{engine} login to {host}")
    target = f"{uri}:{tag}"
    run([engine, "tag", image, target])
    say(f"pushing {target}")
    # podman pushes OCI manifests unless told otherwise, and SageMaker rejects those;
    # v2s2 is Docker's schema 2, which it takes. (docker pushes what it built: see make build.)
    run([engine, "push", *(["--format", "v2s2"] if engine == "podman" else []), target], what=f"{engine} push {target}", progress=True)
    return f"{uri}@{image_digest(aws, repository, tag, image)}"


def _checked(runner: Runner):
    """runner, raising DeployError with the engine's last line when a command fails."""

    def run(argv: list[str], input: bytes | None = None, what: str = "", progress: bool = False) -> Completed:
        done = runner(argv, input, progress=True) if progress else runner(argv, input)
        if done.returncode != 0:
            detail = _last_line(done.stderr) or _last_line(done.stdout) or f"exit status {done.returncode}"
            raise DeployError(f"{what or ' '.join(argv[:2])} failed: {detail}")
        return done

    return run


def _check_local_image(runner: Runner, engine: str, image: str) -> None:
    if runner([engine, "image", "inspect", image], None).returncode != 0:
        raise DeployError(f"image {image} not found by {engine} (`{engine} image inspect` failed); build it first (make build)")


def write_atomically(path: str | Path, text: str) -> None:
    """Write the whole file or nothing: a failed or interrupted command leaves no empty file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(scratch, path)
    except BaseException:
        os.unlink(scratch)
        raise


# ---------------------------------------------------------------- private registries

# Docker's schema 2: what SageMaker pulls. OCI manifests and indexes it refuses.
DOCKER_V2_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
_MANIFEST_ACCEPT = ", ".join(
    (DOCKER_V2_MANIFEST, "application/vnd.docker.distribution.manifest.list.v2+json", "application/vnd.oci.image.manifest.v1+json",
     "application/vnd.oci.image.index.v1+json")
)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_REGISTRY_REF = re.compile(r"^(?P<host>[A-Za-z0-9.-]+(?::\d+)?)/(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?$")


def parse_registry(reference: str) -> tuple[str, str, str | None]:
    """'HOST[:PORT]/REPO[:TAG]' -> (host, repo, tag or None)."""
    found = _REGISTRY_REF.match(reference)
    host = found["host"] if found else ""
    # Docker reads a first part without '.' or ':' as a Docker Hub namespace, not a host.
    if not found or not ("." in host or ":" in host or host == "localhost"):
        raise DeployError(f"--registry takes HOST[:PORT]/REPO (a host with a dot or a port, a lower-case repository), got {reference!r}")
    return host, found["repo"], found["tag"]


def registry_password(username: str | None, from_stdin: bool, env_name: str) -> str | None:
    """The registry password from stdin or an environment variable, never from an argument."""
    if not username:
        if from_stdin:
            raise DeployError("--password-stdin needs --username")
        return None
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise DeployError("--password-stdin read an empty password")
        return password
    password = os.environ.get(env_name)
    if not password:
        raise DeployError(f"no password for {username}: pipe it to --password-stdin or set {env_name} (never pass it as an argument)")
    return password


def push_to_registry(
    image: str,
    registry: str,
    tag: str | None,
    engine: str | None,
    username: str | None = None,
    password: str | None = None,
    insecure: bool = False,
    runner: Runner = subprocess_runner,
) -> str:
    """Push to a Docker Registry HTTP API v2 registry; returns 'host/repo@sha256:...'.

    The engine logs in (when a user is given) and pushes Docker schema 2; the manifest is
    then read back from the registry, so a format SageMaker would refuse is caught here.
    """
    host, repository, tag_in_reference = parse_registry(registry)
    if tag and tag_in_reference and tag != tag_in_reference:
        raise DeployError(f"--tag {tag} and the tag in --registry {registry} differ; give one")
    tag = tag or tag_in_reference or split_reference(image)[1]
    engine = choose_engine(runner, engine)
    if insecure and engine != "podman":
        raise DeployError("--insecure is for podman; docker takes plain-HTTP registries from insecure-registries in its daemon.json")
    tls = ["--tls-verify=false"] if insecure else []
    run = _checked(runner)
    _check_local_image(runner, engine, image)
    if username:
        run([engine, "login", *tls, "--username", username, "--password-stdin", host], password.encode(), what=f"{engine} login to {host}")
    target = f"{host}/{repository}:{tag}"
    run([engine, "tag", image, target])
    say(f"pushing {target}")
    with tempfile.TemporaryDirectory() as scratch:
        digest_file = Path(scratch) / "digest"
        if engine == "podman":
            argv = [engine, "push", "--format", "v2s2", *tls, "--digestfile", str(digest_file), target]
        else:
            argv = [engine, "push", target]
        done = run(argv, what=f"{engine} push {target}", progress=True)
        reported = digest_file.read_text().strip() if digest_file.exists() else ""
    # podman writes the digest file; docker prints "TAG: digest: sha256:... size: N" last.
    printed = _DIGEST.findall(done.stdout + done.stderr)
    digest = reported if _DIGEST.fullmatch(reported) else (printed[-1] if printed else None)
    if not digest:
        raise DeployError(f"{engine} push {target} reported no digest")
    check_registry_manifest(host, repository, digest, username, password, insecure)
    return f"{host}/{repository}@{digest}"


def check_registry_manifest(host: str, repository: str, digest: str, username: str | None, password: str | None, insecure: bool) -> None:
    """Read the pushed manifest back and refuse a type SageMaker rejects."""
    import requests

    url = f"{'http' if insecure else 'https'}://{host}/v2/{repository}/manifests/{digest}"
    headers = {"Accept": _MANIFEST_ACCEPT}
    try:
        response = requests.head(url, headers=headers, timeout=30, verify=not insecure)
        if response.status_code == 401:
            challenge = response.headers.get("WWW-Authenticate", "")
            auth = _registry_auth(challenge, repository, username, password, insecure)
            if auth is None and not username:
                say(f"note: {host} wants a login to read the manifest back; pass --username to check its format here")
                return
            if auth is None:
                say(f"note: could not answer {host}'s login challenge ({challenge[:100]!r}) to read the manifest back; "
                    "SageMaker needs Docker v2 schema 2")
                return
            response = requests.head(url, headers={**headers, **auth}, timeout=30, verify=not insecure)
    except requests.RequestException as error:
        say(f"note: could not read the manifest back from {host} ({type(error).__name__}); SageMaker needs Docker v2 schema 2")
        return
    if response.status_code != 200:
        raise DeployError(f"the push finished but {host} answers {response.status_code} for {repository}@{digest}")
    media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
    if media_type != DOCKER_V2_MANIFEST:
        raise DeployError(
            f"{host}/{repository}@{digest} has a {media_type or 'untyped'} manifest; SageMaker needs Docker v2 schema 2 "
            f"({DOCKER_V2_MANIFEST}): push with podman --format v2s2 or build with docker build --provenance=false"
        )


def _registry_auth(challenge: str, repository: str, username: str | None, password: str | None, insecure: bool) -> dict | None:
    """Headers answering a registry's 401: Basic, or a Bearer token from its token service."""
    import requests

    if not username:
        return None
    scheme, _, params = challenge.partition(" ")
    if scheme.lower() == "basic":
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}
    if scheme.lower() == "bearer":
        # A name starts a word: no search from inside one (quadratic in a long one).
        fields = dict(re.findall(r'(?<!\w)(\w+)="([^"]*)"', params))
        if not fields.get("realm"):
            return None  # no token service named: nothing to ask for a token
        query = {"service": fields.get("service", ""), "scope": fields.get("scope") or f"repository:{repository}:pull"}
        answer = requests.get(fields["realm"], params=query, auth=(username, password), timeout=30, verify=not insecure)
        answer.raise_for_status()
        token = answer.json().get("token") or answer.json().get("access_token")
        return {"Authorization": f"Bearer {token}"} if token else None
    return None


# ---------------------------------------------------------------- ECR


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
