"""push --registry against a real Docker Registry HTTP API v2 server, with real podman.

The registry is distribution (Debian's `docker-registry` package, the code behind the
`registry:2` image) on a free local port, with htpasswd (Basic) authentication over
plain HTTP, so podman needs --insecure (--tls-verify=false). The image is a one-file
image made with `podman import`: the push path does not depend on what is inside.

What is checked: the engine commands as run (password on stdin only), the URI printed,
and the manifest as the registry serves it, read here with plain HTTP: Docker v2 schema
2, what SageMaker pulls. Skips, saying why, where podman or the registry cannot run.
"""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import tarfile
import time

import pytest
import requests

from deploy.push import subprocess_runner
from tests.deploy.support import one_error_line

pytestmark = pytest.mark.container

USER, PASSWORD = "ci-pusher", "s3cret-not-an-argument"
IMAGE = "localhost/registry-push-test:1"


def _podman_works() -> str | None:
    if not shutil.which("podman"):
        return "podman is not installed (scripts/setup_podman.sh installs it)"
    if subprocess.run(["podman", "info"], capture_output=True, timeout=60).returncode != 0:
        return "podman is installed but `podman info` fails here"
    return None


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    why = _podman_works()
    if why:
        pytest.skip(why)
    for tool in ("docker-registry", "htpasswd"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed (Debian: apt-get install docker-registry apache2-utils)")
    root = tmp_path_factory.mktemp("registry")
    htpasswd = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True).stdout
    (root / "htpasswd").write_text(htpasswd)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "config.yml").write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n"
        f"auth: {{htpasswd: {{realm: test, path: {root / 'htpasswd'}}}}}\n"
    )
    log = open(root / "registry.log", "wb")
    server = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    host = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"http://{host}/v2/", timeout=2).status_code == 401:  # up, and wants a login
                    break
            except requests.ConnectionError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"docker-registry did not start: {(root / 'registry.log').read_text()[-500:]}")
            time.sleep(0.1)
        # A tiny image: one file, imported from a tar.
        layer = io.BytesIO()
        with tarfile.open(fileobj=layer, mode="w") as tar:
            data = b"hello from the registry test\n"
            info = tarfile.TarInfo("hello.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        made = subprocess.run(["podman", "import", "-", IMAGE], input=layer.getvalue(), capture_output=True, timeout=120)
        if made.returncode != 0:
            pytest.skip(f"podman import failed: {made.stderr.decode()[-300:]}")
        yield host
    finally:
        server.terminate()
        server.wait(10)
        log.close()
        subprocess.run(["podman", "rmi", "-f", IMAGE, f"{host}/team/digits:v7"], capture_output=True, timeout=120)


@pytest.fixture
def own_auth_file(tmp_path, monkeypatch):
    """podman's login goes to a file of this test's own, never the user's auth.json."""
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "auth.json"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "REGISTRY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)  # and no AWS at all: a registry push needs none
    return tmp_path / "auth.json"


def recording_runner(calls: list):
    def run(argv, input=None, progress=False):
        calls.append((list(argv), input))
        return subprocess_runner(argv, input, progress=progress)

    return run


def test_push_to_a_private_registry(registry, own_auth_file, cli, monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    output = tmp_path / "image-uri"
    status, out, err = cli("push", IMAGE, "--registry", f"{registry}/team/digits", "--tag", "v7", "--engine", "podman",
                           "--username", USER, "--password-stdin", "--insecure", "--output", str(output),
                           runner=recording_runner(calls))
    assert status == 0, err
    uri = out.strip()
    assert uri.startswith(f"{registry}/team/digits@sha256:") and output.read_text() == out
    digest = uri.rsplit("@", 1)[1]

    # The commands: the password went in on stdin only, never into an argument.
    assert [argv[:2] for argv, _ in calls] == [["podman", "image"], ["podman", "login"], ["podman", "tag"], ["podman", "push"]]
    login_argv, login_input = calls[1]
    assert login_argv == ["podman", "login", "--tls-verify=false", "--username", USER, "--password-stdin", registry]
    assert login_input == PASSWORD.encode()
    assert all(PASSWORD not in " ".join(argv) for argv, _ in calls)
    push_argv = calls[3][0]
    assert push_argv[:5] == ["podman", "push", "--format", "v2s2", "--tls-verify=false"] and push_argv[-1] == f"{registry}/team/digits:v7"
    assert "Writing manifest" in err  # podman's progress, relayed to stderr as it pushed

    # The registry's own answer: a Docker v2 schema 2 manifest under the printed digest and the tag.
    accept = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
    for reference in (digest, "v7"):
        answer = requests.get(f"http://{registry}/v2/team/digits/manifests/{reference}", auth=(USER, PASSWORD),
                              headers={"Accept": accept}, timeout=10)
        assert answer.status_code == 200
        assert answer.headers["Content-Type"] == "application/vnd.docker.distribution.manifest.v2+json"
        assert answer.headers["Docker-Content-Digest"] == digest
        manifest = json.loads(answer.content)
        assert manifest["schemaVersion"] == 2
        assert manifest["config"]["mediaType"] == "application/vnd.docker.container.image.v1+json"
        assert {layer["mediaType"] for layer in manifest["layers"]} == {"application/vnd.docker.image.rootfs.diff.tar.gzip"}
    assert requests.get(f"http://{registry}/v2/team/digits/manifests/v7", timeout=10).status_code == 401  # it really wanted the login


def test_password_from_an_environment_variable(registry, own_auth_file, cli, monkeypatch):
    monkeypatch.setenv("PUSH_SECRET", PASSWORD)
    calls: list = []
    status, out, err = cli("push", IMAGE, "--registry", f"{registry}/team/digits:v7", "--engine", "podman", "--username", USER,
                           "--password-env", "PUSH_SECRET", "--insecure", runner=recording_runner(calls))
    assert status == 0, err
    assert out.startswith(f"{registry}/team/digits@sha256:")
    assert calls[1][1] == PASSWORD.encode() and all(PASSWORD not in " ".join(argv) for argv, _ in calls)


def test_a_wrong_password_is_one_line(registry, own_auth_file, cli, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("wrong\n"))
    status, out, err = cli("push", IMAGE, "--registry", f"{registry}/team/digits", "--engine", "podman", "--username", USER,
                           "--password-stdin", "--insecure")
    assert (status, out) == (1, "")
    line = one_error_line(err)
    assert line.startswith(f"error: podman login to {registry} failed:") and "wrong" not in line
