"""push against moto's ECR, with the container engine behind a recording runner.

What is real here: the ECR repository creation, the authorization token and the
describe_images digest lookup, all over HTTP against moto; the exact engine command
lines and the password on stdin. What is not: no engine runs and no registry receives
layers (moto serves ECR's API, not the Docker registry protocol). The runner stands in
for `docker push` by doing what a push leaves behind in ECR: it uploads a layer and
puts the manifest through ECR's own API, so the digest the tool prints comes from ECR.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from deploy.push import Completed
from tests.deploy.support import ACCOUNT, REGION

REGISTRY = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com"


class Engine:
    """Answers engine commands the way docker/podman would, and records them."""

    def __init__(self, boto, answering=("docker", "podman"), local_images=("sagemaker-pytorch-byoc:latest",), push_fails=False,
                 manifest_type=None):
        self.boto = boto
        # What the pushed manifest is; None: as the engine writes it (podman honours --format).
        self.manifest_type = manifest_type
        self.answering = set(answering)
        self.local_images = set(local_images)
        self.push_fails = push_fails
        self.calls: list[tuple[list[str], bytes | None]] = []
        self.relayed: list[list[str]] = []  # commands whose output the tool relays as progress
        self.tags: dict[str, str] = {}

    def __call__(self, argv, input=None, progress=False):
        argv = list(argv)
        self.calls.append((argv, input))
        if progress:
            self.relayed.append(argv)
        engine, verb, *rest = argv
        if engine not in self.answering:
            return Completed(1, "", f"Cannot connect to the {engine} daemon")
        if verb == "info":
            return Completed(0, "ok", "")
        if verb == "image" and rest[0] == "inspect":
            return Completed(0 if rest[1] in self.local_images else 1, "", "" if rest[1] in self.local_images else f"Error: No such image: {rest[1]}")
        if verb == "login":
            return Completed(0, "Login Succeeded", "")
        if verb == "tag":
            self.tags[rest[1]] = rest[0]
            return Completed(0, "", "")
        if verb == "push":
            if self.push_fails:
                return Completed(1, "", "denied: Your authorization token has expired. Reauthenticate and try again.")
            return self._registry_receives(engine, rest)
        return Completed(125, "", f"unexpected command {argv}")

    def _registry_receives(self, engine: str, args: list[str]) -> Completed:
        *options, target = args
        # podman pushes OCI unless --format v2s2 says otherwise; docker pushes what it built.
        oci = engine == "podman" and options != ["--format", "v2s2"]
        media_type = self.manifest_type or ("application/vnd.oci.image.manifest.v1+json" if oci else "application/vnd.docker.distribution.manifest.v2+json")
        repository_uri, tag = target.rsplit(":", 1)
        repository = repository_uri.split("/", 1)[1]
        ecr = self.boto("ecr")
        layer = f"layer of {self.tags[target]}".encode()
        upload = ecr.initiate_layer_upload(repositoryName=repository)["uploadId"]
        ecr.upload_layer_part(repositoryName=repository, uploadId=upload, partFirstByte=0, partLastByte=len(layer) - 1, layerPartBlob=layer)
        layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
        ecr.complete_layer_upload(repositoryName=repository, uploadId=upload, layerDigests=[layer_digest])
        manifest = {"schemaVersion": 2, "mediaType": media_type,
                    "layers": [{"digest": layer_digest, "size": len(layer)}]}
        try:
            ecr.put_image(repositoryName=repository, imageManifest=json.dumps(manifest), imageTag=tag)
        except ecr.exceptions.ImageAlreadyExistsException:
            pass  # a registry takes an identical push again without complaint
        return Completed(0, f"{tag}: digest: pushed", "")


def test_push_creates_repository_logs_in_tags_pushes_and_prints_the_digest(aws_env, boto, cli):
    engine = Engine(boto)
    status, out, err = cli("push", "sagemaker-pytorch-byoc:latest", "--repository", "digits", "--tag", "v3", runner=engine)
    assert status == 0, err

    ecr = boto("ecr")
    [repository] = ecr.describe_repositories()["repositories"]
    assert repository["repositoryName"] == "digits"
    [image] = ecr.describe_images(repositoryName="digits")["imageDetails"]
    assert out.strip() == f"{REGISTRY}/digits@{image['imageDigest']}"
    assert image["imageDigest"].startswith("sha256:") and image["imageTags"] == ["v3"]

    token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    user, password = base64.b64decode(token).decode().split(":", 1)
    assert engine.calls == [
        (["docker", "info"], None),
        (["docker", "image", "inspect", "sagemaker-pytorch-byoc:latest"], None),
        (["docker", "login", "--username", user, "--password-stdin", REGISTRY], password.encode()),
        (["docker", "tag", "sagemaker-pytorch-byoc:latest", f"{REGISTRY}/digits:v3"], None),
        (["docker", "push", f"{REGISTRY}/digits:v3"], None),
    ]
    assert all(password not in " ".join(argv) for argv, _ in engine.calls)
    # The push, which takes minutes, is the one whose output reaches the user as it comes.
    assert engine.relayed == [["docker", "push", f"{REGISTRY}/digits:v3"]]

    # Again: the repository exists already, the same digest comes back.
    status, again, err = cli("push", "sagemaker-pytorch-byoc:latest", "--repository", "digits", "--tag", "v3", runner=engine)
    assert status == 0, err
    assert again == out
    assert len(ecr.describe_repositories()["repositories"]) == 1


def test_push_falls_back_to_podman_and_names_the_repository_after_the_image(aws_env, boto, cli):
    engine = Engine(boto, answering=("podman",), local_images=("localhost/sagemaker-pytorch-byoc:dev",))
    status, out, err = cli("push", "localhost/sagemaker-pytorch-byoc:dev", runner=engine)
    assert status == 0, err
    assert out.startswith(f"{REGISTRY}/sagemaker-pytorch-byoc@sha256:")
    assert [argv[:2] for argv, _ in engine.calls] == [
        ["docker", "info"], ["podman", "info"], ["podman", "image"], ["podman", "login"], ["podman", "tag"], ["podman", "push"]]
    # Docker schema 2, not podman's default OCI manifest, which SageMaker rejects.
    assert engine.calls[-1][0] == ["podman", "push", "--format", "v2s2", f"{REGISTRY}/sagemaker-pytorch-byoc:dev"]
    [pushed] = boto("ecr").describe_images(repositoryName="sagemaker-pytorch-byoc")["imageDetails"]
    assert pushed["imageManifestMediaType"] == "application/vnd.docker.distribution.manifest.v2+json"


def test_engine_option_skips_the_probe(aws_env, boto, cli):
    engine = Engine(boto, answering=("podman",))
    status, _, err = cli("push", "sagemaker-pytorch-byoc:latest", "--engine", "podman", runner=engine)
    assert status == 0, err
    assert engine.calls[0][0] == ["podman", "image", "inspect", "sagemaker-pytorch-byoc:latest"]


@pytest.mark.parametrize(
    ("engine_kwargs", "argv", "message"),
    [
        ({"answering": ()}, ["push", "sagemaker-pytorch-byoc:latest"], "error: no container engine answers"),
        ({}, ["push", "not-built:latest"], "error: image not-built:latest not found by docker"),
        ({"push_fails": True}, ["push", "sagemaker-pytorch-byoc:latest"], "error: docker push"),
    ],
)
def test_push_failures_are_one_line(aws_env, boto, cli, engine_kwargs, argv, message):
    status, out, err = cli(*argv, runner=Engine(boto, **engine_kwargs))
    assert status == 1
    assert out == ""
    # Progress may come before it; the failure itself is the last line, and the only error.
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith(message), err
    assert err.count("error:") == 1, err


@pytest.mark.parametrize(
    ("media_type", "kind"),
    [("application/vnd.oci.image.index.v1+json", "an OCI image index"), ("application/vnd.oci.image.manifest.v1+json", "an OCI manifest")],
)
def test_push_refuses_an_oci_image(aws_env, boto, cli, media_type, kind):
    """docker build with its default provenance attestation pushes an OCI index, which SageMaker rejects."""
    status, out, err = cli("push", "sagemaker-pytorch-byoc:latest", "--repository", "digits", runner=Engine(boto, manifest_type=media_type))
    assert (status, out) == (1, "")
    assert err.splitlines()[-1] == (
        f"error: image sagemaker-pytorch-byoc:latest has {kind} ({media_type}), which SageMaker rejects; rebuild it with "
        "`podman build --format docker` or `docker build --provenance=false` (make build does) and push again"
    )
    assert err.count("error:") == 1 and "Traceback" not in err


# ---------------------------------------------------------------- --output, progress


def test_output_file_is_written_only_by_a_successful_push(aws_env, boto, cli, tmp_path):
    """make push writes build/image-uri through --output: a failed push must leave nothing."""
    target = tmp_path / "build" / "image-uri"
    status, _, err = cli("push", "sagemaker-pytorch-byoc:latest", "--output", str(target), runner=Engine(boto, push_fails=True))
    assert status == 1, err
    assert not target.exists()
    assert not (tmp_path / "build").exists() or list((tmp_path / "build").iterdir()) == []  # no empty or temporary file

    status, out, err = cli("push", "sagemaker-pytorch-byoc:latest", "--output", str(target), runner=Engine(boto))
    assert status == 0, err
    assert target.read_text() == out  # the URI and its newline, the same as stdout
    assert list(target.parent.iterdir()) == [target]


def test_make_push_hands_the_file_to_the_tool():
    """The Makefile's push target no longer redirects into a temporary file of its own."""
    import subprocess

    from tests.deploy.support import REPO_ROOT

    dry = subprocess.run(["make", "-n", "push", "IMAGE=sagemaker-pytorch-byoc:latest"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    [line] = [line for line in dry.stdout.splitlines() if " -m deploy push " in line]
    assert line.endswith("-m deploy push sagemaker-pytorch-byoc:latest --output build/image-uri")
    assert "image-uri.tmp" not in dry.stdout


def test_the_engines_progress_reaches_stderr_while_it_runs(tmp_path, monkeypatch):
    """subprocess_runner(progress=True) relays output as it comes, not when the engine exits.

    The child prints a line, then waits until the test has seen that line on the tool's
    stderr; if the tool held the output back until the child ended, neither would move.
    """
    import sys
    import threading

    from deploy.push import subprocess_runner

    released = tmp_path / "released"
    seen = threading.Event()

    class Stderr:
        def __init__(self):
            self.text = ""

        def write(self, text):
            self.text += text
            if "layer 1/2 pushed" in self.text:
                seen.set()
                released.touch()

        def flush(self):
            pass

    stderr = Stderr()
    monkeypatch.setattr(sys, "stderr", stderr)
    child = (
        "import os, sys, time\n"
        "print('layer 1/2 pushed', flush=True)\n"
        f"deadline = time.time() + 20\n"
        f"while not os.path.exists({str(released)!r}):\n"
        "    if time.time() > deadline: sys.exit('never released')\n"
        "    time.sleep(0.01)\n"
        "print('layer 2/2 pushed', file=sys.stderr, flush=True)\n"
        "print('v3: digest: sha256:' + 'a' * 64 + ' size: 529', flush=True)\n"
    )
    done = subprocess_runner([sys.executable, "-c", child], None, progress=True)
    assert done.returncode == 0, stderr.text
    assert seen.is_set()
    # Both of the engine's streams reach stderr; the tail is kept for the digest and errors.
    assert stderr.text.splitlines() == ["layer 1/2 pushed", "layer 2/2 pushed", "v3: digest: sha256:" + "a" * 64 + " size: 529"]
    assert done.stdout.endswith("size: 529\n")


# ---------------------------------------------------------------- private registry arguments


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--registry", "team/digits"], "error: --registry takes HOST[:PORT]/REPO (a host with a dot or a port, a lower-case repository), got 'team/digits'"),
        (["--registry", "registry.example.com/Team"], "error: --registry takes HOST[:PORT]/REPO (a host with a dot or a port, a lower-case repository), got 'registry.example.com/Team'"),
        (["--registry", "registry.example.com/team/digits", "--username", "ci"],
         "error: no password for ci: pipe it to --password-stdin or set REGISTRY_PASSWORD (never pass it as an argument)"),
        (["--registry", "registry.example.com/team/digits", "--password-stdin"], "error: --password-stdin needs --username"),
        (["--registry", "localhost:5000/digits", "--insecure", "--engine", "docker"],
         "error: --insecure is for podman; docker takes plain-HTTP registries from insecure-registries in its daemon.json"),
        (["--registry", "localhost:5000/digits", "--repository", "digits"],
         "error: --repository names an ECR repository; with --registry the repository is part of HOST[:PORT]/REPO"),
    ],
)
def test_registry_argument_refusals(monkeypatch, cli, argv, message):
    # No AWS credentials or region at all: a registry push never needs them.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "REGISTRY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    engine = Engine(None, local_images=("sagemaker-pytorch-byoc:latest",))
    status, out, err = cli("push", "sagemaker-pytorch-byoc:latest", *argv, runner=engine)
    assert (status, out) == (1, "")
    assert err.splitlines()[-1] == message
    assert all(argv[1] not in ("login", "push") for argv, _ in engine.calls)


def test_registry_login_flags_are_refused_for_ecr(aws_env, boto, cli):
    engine = Engine(boto)
    status, out, err = cli("push", "sagemaker-pytorch-byoc:latest", "--username", "ci", runner=engine)
    assert (status, out) == (1, "")
    assert err.splitlines()[-1] == "error: --username, --password-stdin and --insecure are for --registry; ECR logs in with your AWS credentials"
    assert engine.calls == [] and boto("ecr").describe_repositories()["repositories"] == []


@pytest.mark.parametrize("challenge", ['Bearer service="registry.example.com"', "Bearer", 'Negotiate abc'])
def test_a_login_challenge_the_tool_cannot_answer_is_a_note_not_a_crash(challenge, capsys):
    """The read-back of a pushed manifest meets a 401 whose challenge names no token
    service (or a scheme other than Basic and Bearer): the push stands, and it says so."""
    import http.server
    import threading

    from deploy import push

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 - http.server's name
            self.send_response(401)
            self.send_header("WWW-Authenticate", challenge)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        push.check_registry_manifest(f"127.0.0.1:{server.server_port}", "team/digits", "sha256:" + "0" * 64,
                                     "ci", "secret", insecure=True)
    finally:
        server.shutdown()
        server.server_close()
    note = capsys.readouterr().err.strip().splitlines()[-1]
    assert note.startswith(f"note: could not answer 127.0.0.1:{server.server_port}'s login challenge"), note
