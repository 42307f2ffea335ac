"""A real moto server for the deploy tool: every boto3 client talks HTTP to it.

The server runs in this process (ThreadedMotoServer), so a test can also reach into its
backends to script what moto cannot produce by itself (a Failed endpoint). Its request
recorder keeps every request's headers and body, so a test can check the bytes the tool
sent, not only what moto made of them.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

import pytest

# The recorder reads its file location when moto is imported, so set it first; keep
# the recording out of the working tree.
os.environ.setdefault("MOTO_RECORDER_FILEPATH", os.path.join(tempfile.mkdtemp(prefix="moto-recorder-"), "requests.jsonl"))

from tests.deploy.support import IMAGE, REGION, Moto  # noqa: E402

import botocore.session  # noqa: E402

# Each test makes boto3 sessions of its own (the tool's, the checks'), and a new session
# parses botocore's service models again: most of a deploy test's CPU. One loader for
# the process, as one long-lived session would have; its models are only read.
botocore.session.create_loader = functools.lru_cache(maxsize=None)(botocore.session.create_loader)


@pytest.fixture(scope="session")
def moto_server():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield Moto(f"http://{host}:{port}")
    server.stop()


@pytest.fixture
def components(monkeypatch):
    """The inference components the moto server gains for the test (fake_components.py)."""
    from tests.deploy.fake_components import Components

    fake = Components()
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def sent_requests(monkeypatch):
    """Every request the tool's clients build in this process, each checked against
    botocore's service model before it is sent (requests_check.py)."""
    from deploy.aws import Aws
    from tests.deploy.requests_check import RequestLog

    log = RequestLog()
    original = Aws.client

    def client(self, service):
        fresh = service not in self._clients
        made = original(self, service)
        if fresh:
            made.meta.events.register("before-parameter-build.*.*", log.hook(service))
        return made

    monkeypatch.setattr(Aws, "client", client)
    return log


@pytest.fixture
def aws_env(moto_server, monkeypatch, tmp_path, components, sent_requests):
    """Fake credentials and the moto endpoint in the environment; a clean moto per test,
    with inference components, and every request the tool builds checked against botocore."""
    moto_server.reset()
    for name in ("AWS_PROFILE", "AWS_REGION", "AWS_SESSION_TOKEN", "SAGEMAKER_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    # Nothing from the host's ~/.aws may leak in.
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.url)
    return moto_server


@pytest.fixture
def boto(aws_env):
    """Independent boto3 clients for setting up and for checking what the tool did."""
    import boto3

    session = boto3.Session(region_name=REGION)
    return lambda service: session.client(service, endpoint_url=aws_env.url)


@pytest.fixture
def role(boto) -> str:
    """An execution role that exists in moto's IAM."""
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
    return boto("iam").create_role(RoleName="SageMakerExecution", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """A small model directory with a nested file, as SageMaker would unpack it."""
    directory = tmp_path / "model"
    (directory / "code").mkdir(parents=True)
    (directory / "model.pt2").write_bytes(bytes(range(256)) * 8)
    (directory / "metadata.json").write_text(json.dumps({"inputs": [{"name": "pixels"}]}))
    (directory / "code" / "inference.py").write_text("def model_fn(model_dir):\n    return None\n")
    (directory / "__pycache__").mkdir()
    (directory / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    return directory


@pytest.fixture
def cli(capsys):
    """Run the tool in this process: (exit status, stdout, stderr)."""
    from deploy.cli import main

    def run(*argv: str, runner=None):
        capsys.readouterr()
        status = main(list(argv), runner=runner)
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.fixture
def image(boto) -> str:
    """An image in moto's ECR with a Docker schema 2 manifest, by tag."""
    ecr = boto("ecr")
    ecr.create_repository(repositoryName="sagemaker-pytorch-byoc")
    ecr.put_image(repositoryName="sagemaker-pytorch-byoc", imageTag="v1",
                  imageManifest=json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                                             "layers": [{"digest": "sha256:" + "2" * 64}]}))
    return IMAGE


@pytest.fixture
def model(cli, boto, role, image) -> str:
    """Model "digits" created through the tool, its data in s3://artifacts."""
    boto("s3").create_bucket(Bucket="artifacts")
    boto("s3").put_object(Bucket="artifacts", Key="model.tar.gz", Body=b"archive")
    status, _, err = cli("create-model", "--model-name", "digits", "--image", image, "--model-data", "s3://artifacts/model.tar.gz", "--role", role)
    assert status == 0, err
    return "digits"
