"""Multi-model endpoints, uncompressed model data, detailed observability, and the
invoke options SageMaker's runtime takes, against the moto server.

moto stores models' containers as sent, so those are checked in the request (moto's
recorder) and in what moto describes back; it drops an endpoint config's MetricsConfig,
and answers no stateful sessions, so those are checked in the request as sent and, for
the session headers, with botocore's Stubber (which checks both directions against the
service model). Every request is also checked against the model by sent_requests.
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from tests.deploy.support import by_target, one_error_line



def puts(recorded: list[dict]) -> list[str]:
    return sorted(r["url"].split("127.0.0.1:", 1)[1].split("/", 1)[1].split("?")[0] for r in recorded if r["method"] == "PUT")


def model_folder(root, name: str, weights: bytes):
    folder = root / name
    (folder / "code").mkdir(parents=True)
    (folder / "model.pt").write_bytes(weights)
    (folder / "code" / "inference.py").write_text("def model_fn(model_dir):\n    return None\n")
    return folder


# ---------------------------------------------------------------- multi-model


def test_package_multi_model(aws_env, boto, cli, tmp_path):
    boto("s3").create_bucket(Bucket="artifacts")
    first, second = model_folder(tmp_path, "digits", b"d" * 100), model_folder(tmp_path, "letters", b"l" * 100)
    aws_env.start_recording()
    status, out, err = cli("package", "--multi-model", str(first), str(second), "--bucket", "artifacts")
    assert status == 0, err
    assert out == "s3://artifacts/multi-model/\n"
    assert puts(aws_env.recorded()) == ["artifacts/multi-model/digits.tar.gz", "artifacts/multi-model/letters.tar.gz"]
    body = boto("s3").get_object(Bucket="artifacts", Key="multi-model/letters.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert sorted(tar.getnames()) == ["code/inference.py", "model.pt"]  # the folder's files at the archive's root
        assert tar.extractfile("model.pt").read() == b"l" * 100

    # Again: nothing uploaded. A changed model under an old name is refused, before any upload.
    aws_env.start_recording()
    status, again, err = cli("package", "--multi-model", str(first), str(second), "--bucket", "artifacts")
    assert (status, again) == (0, out) and "already holds this archive" in err
    (second / "model.pt").write_bytes(b"L" * 100)
    third = model_folder(tmp_path, "numbers", b"n")
    status, out, err = cli("package", "--multi-model", str(third), str(second), "--bucket", "artifacts")
    assert (status, out) == (1, "")
    assert one_error_line(err) == ("error: s3://artifacts/multi-model/letters.tar.gz holds another archive; endpoints that loaded it keep "
                                   "serving it, so a new version needs a new name (a directory named letters-v2)")
    assert puts(aws_env.recorded()) == []


def test_package_refusals(aws_env, boto, cli, tmp_path):
    one, other = model_folder(tmp_path, "a", b"1"), model_folder(tmp_path / "elsewhere", "a", b"2")
    for argv, message in (
        (["--multi-model", str(one), str(other)], "error: two model directories are named a; each becomes a.tar.gz, so their names must differ"),
        ([str(one), str(tmp_path)], "error: package takes one model directory; several go under one prefix with --multi-model"),
        (["--multi-model", "--uncompressed", str(one)],
         "error: --multi-model and --uncompressed exclude each other: a multi-model endpoint loads <name>.tar.gz archives"),
    ):
        aws_env.start_recording()
        status, out, err = cli("package", *argv, "--bucket", "artifacts")
        assert (status, out, one_error_line(err)) == (1, "", message)
        assert aws_env.recorded() == []


def test_multi_model_model_and_target_model(aws_env, boto, cli, role, image):
    boto("s3").create_bucket(Bucket="artifacts")
    boto("s3").put_object(Bucket="artifacts", Key="mme/digits.tar.gz", Body=b"archive")
    aws_env.start_recording()
    argv = ("create-model", "--model-name", "many", "--image", image, "--model-data", "s3://artifacts/mme/", "--multi-model", "--role", role)
    status, out, err = cli(*argv)
    assert status == 0, err
    [request] = by_target(aws_env.recorded(), "CreateModel")
    container = request["PrimaryContainer"]
    assert container == {"Image": container["Image"], "Environment": {"SAGEMAKER_MULTI_MODEL": "true"},
                         "ModelDataUrl": "s3://artifacts/mme/", "Mode": "MultiModel"}
    assert "@sha256:" in container["Image"]  # the tag resolved to its digest
    assert boto("sagemaker").describe_model(ModelName="many")["PrimaryContainer"]["Mode"] == "MultiModel"
    status, again, err = cli(*argv)
    assert (status, again) == (0, out) and "exists with these settings" in err

    # One request, one of the prefix's models.
    aws_env.script_invocations({"Body": '{"predictions": [1]}', "ContentType": "application/json", "InvokedProductionVariant": "AllTraffic",
                                "CustomAttributes": ""})
    aws_env.start_recording()
    status, out, err = cli("invoke", "--endpoint-name", "many-ep", "--array", "[[1]]", "--target-model", "digits.tar.gz")
    assert status == 0, err
    [call] = [r for r in aws_env.recorded() if r["url"].endswith("/endpoints/many-ep/invocations")]
    assert {k.lower(): v for k, v in call["headers"].items()}["x-amzn-sagemaker-target-model"] == "digits.tar.gz"


def test_an_empty_multi_model_prefix_is_a_note(aws_env, boto, cli, role, image):
    boto("s3").create_bucket(Bucket="artifacts")
    status, _, err = cli("create-model", "--model-name", "many", "--image", image, "--model-data", "s3://artifacts/later/", "--multi-model", "--role", role)
    assert status == 0, err
    assert "note: s3://artifacts/later/ holds no models yet; add <name>.tar.gz archives (package --multi-model) before invoking" in err


# ---------------------------------------------------------------- uncompressed


def test_package_and_create_model_uncompressed(aws_env, boto, cli, role, image, model_dir):
    boto("s3").create_bucket(Bucket="artifacts")
    aws_env.start_recording()
    status, out, err = cli("package", "--uncompressed", str(model_dir), "--bucket", "artifacts")
    assert status == 0, err
    prefix = out.strip()
    assert prefix.startswith("s3://artifacts/models/") and prefix.endswith("/")
    key = prefix.removeprefix("s3://artifacts/")
    # The files as they are, each at its path below the prefix; no archive, no build leftovers.
    assert puts(aws_env.recorded()) == [f"artifacts/{key}{name}" for name in ("code/inference.py", "metadata.json", "model.pt2")]
    assert boto("s3").get_object(Bucket="artifacts", Key=f"{key}model.pt2")["Body"].read() == (model_dir / "model.pt2").read_bytes()
    assert "uploading 3 files" in err
    aws_env.start_recording()
    status, again, err = cli("package", "--uncompressed", str(model_dir), "--bucket", "artifacts")
    assert (status, again) == (0, out) and "already holds these files" in err
    assert puts(aws_env.recorded()) == []

    aws_env.start_recording()
    status, _, err = cli("create-model", "--model-name", "raw", "--image", image, "--model-data", prefix, "--uncompressed", "--role", role)
    assert status == 0, err
    [request] = by_target(aws_env.recorded(), "CreateModel")
    source = {"S3DataSource": {"S3Uri": prefix, "S3DataType": "S3Prefix", "CompressionType": "None"}}
    assert request["PrimaryContainer"]["ModelDataSource"] == source
    assert "ModelDataUrl" not in request["PrimaryContainer"]
    assert boto("sagemaker").describe_model(ModelName="raw")["PrimaryContainer"]["ModelDataSource"] == source
    status, _, err = cli("create-model", "--model-name", "raw", "--image", image, "--model-data", prefix, "--uncompressed", "--role", role)
    assert status == 0 and "exists with these settings" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model-data", "s3://artifacts/raw/", "--uncompressed"], "error: model data s3://artifacts/raw/ holds no files; run `python -m deploy package --uncompressed DIR` first"),
        (["--model-data", "s3://artifacts/raw", "--uncompressed"], "error: --uncompressed takes an S3 prefix ending in /, got 's3://artifacts/raw'"),
        (["--uncompressed"], "error: --uncompressed needs --model-data s3://BUCKET/PREFIX/ (the prefix its files are under)"),
        (["--model-data", "s3://artifacts/raw/"],
         "error: --model-data s3://artifacts/raw/ is a prefix: add --uncompressed (a model's files as they are) or --multi-model "
         "(a prefix of <name>.tar.gz archives), or give the model.tar.gz URL"),
        (["--model-data", "s3://artifacts/mme/", "--multi-model", "--uncompressed"],
         "error: --multi-model and --uncompressed exclude each other: a multi-model endpoint loads <name>.tar.gz archives"),
        (["--model-data", "s3://artifacts/m.tar.gz", "--metrics-path", "metrics"],
         "error: --metrics-path must be a path such as /metrics (letters, digits, / _ . -), got 'metrics'"),
    ],
)
def test_model_data_refusals(aws_env, boto, cli, role, image, flags, message):
    boto("s3").create_bucket(Bucket="artifacts")
    status, out, err = cli("create-model", "--model-name", "m", "--image", image, "--role", role, *flags)
    assert (status, out) == (1, "")
    assert one_error_line(err) == message
    assert boto("sagemaker").list_models()["Models"] == []


# ---------------------------------------------------------------- observability


def test_metrics_path_and_detailed_observability(aws_env, boto, cli, role, image, sent_requests):
    boto("s3").create_bucket(Bucket="artifacts")
    boto("s3").put_object(Bucket="artifacts", Key="model.tar.gz", Body=b"archive")
    aws_env.start_recording()
    status, _, err = cli("create-model", "--model-name", "digits", "--image", image, "--model-data", "s3://artifacts/model.tar.gz", "--role", role,
                         "--metrics-path", "/server/metrics", "--metrics-interval", "10")
    assert status == 0, err
    [model] = by_target(aws_env.recorded(), "CreateModel")
    metrics = {"MetricsEndpoints": [{"MetricsEndpointPath": "/server/metrics", "MetricPublishFrequencyInSeconds": 10}]}
    assert model["PrimaryContainer"]["ContainerMetricsConfig"] == metrics
    assert boto("sagemaker").describe_model(ModelName="digits")["PrimaryContainer"]["ContainerMetricsConfig"] == metrics

    plain = ("create-endpoint", "--endpoint-name", "plain", "--model-name", "digits", "--poll-seconds", "0.1")
    assert cli(*plain)[0] == 0
    aws_env.start_recording()
    status, _, err = cli("create-endpoint", "--endpoint-name", "observed", "--model-name", "digits", "--poll-seconds", "0.1",
                         "--detailed-observability", "--metrics-interval", "30")
    assert status == 0, err
    [config] = by_target(aws_env.recorded(), "CreateEndpointConfig")
    assert config["MetricsConfig"] == {"EnableDetailedObservability": True, "MetricPublishFrequencyInSeconds": 30}
    assert sent_requests("sagemaker", "CreateEndpointConfig")[-1]["MetricsConfig"] == config["MetricsConfig"]
    # The same variant with other metrics is another config (configs are named by content).
    configs = {c["EndpointConfigName"].split("-", 1)[1] for c in boto("sagemaker").list_endpoint_configs()["EndpointConfigs"]}
    assert len(configs) == 2
    # Off is said explicitly; unset leaves SageMaker's default (on for new configs).
    aws_env.start_recording()
    assert cli("create-endpoint", "--endpoint-name", "quiet", "--model-name", "digits", "--poll-seconds", "0.1", "--no-detailed-observability")[0] == 0
    [config] = by_target(aws_env.recorded(), "CreateEndpointConfig")
    assert config["MetricsConfig"] == {"EnableDetailedObservability": False}
    assert "MetricsConfig" not in sent_requests("sagemaker", "CreateEndpointConfig")[0]  # the plain endpoint's


# ---------------------------------------------------------------- invoke options


def test_invoke_options_on_the_wire(aws_env, cli):
    aws_env.script_invocations({"Body": '{"predictions": [1]}', "ContentType": "application/json", "InvokedProductionVariant": "AllTraffic",
                                "CustomAttributes": "model_version=7"})
    aws_env.start_recording()
    status, out, err = cli("invoke", "--endpoint-name", "ep", "--array", "[[1]]", "--custom-attributes", "trace=abc", "--inference-id", "req-9",
                           "--inference-component", "digits-ic")
    assert status == 0, err
    assert json.loads(out) == {"predictions": [1]}  # stdout stays the body
    assert "CustomAttributes: model_version=7" in err.splitlines()
    [call] = [r for r in aws_env.recorded() if r["url"].endswith("/endpoints/ep/invocations")]
    headers = {k.lower(): v for k, v in call["headers"].items()}
    assert headers["x-amzn-sagemaker-custom-attributes"] == "trace=abc"
    assert headers["x-amzn-sagemaker-inference-id"] == "req-9"
    assert headers["x-amzn-sagemaker-inference-component"] == "digits-ic"
    assert "x-amzn-sagemaker-target-model" not in headers and "x-amzn-sagemaker-session-id" not in headers


def stub_runtime(monkeypatch, response: dict, expected: dict) -> Stubber:
    """The tool's sagemaker-runtime client under botocore's Stubber, primed with one call.

    The Stubber checks that the request equals `expected`, and both it and the response
    against the service model.
    """
    from deploy.aws import Aws

    stubber: list[Stubber] = []
    original = Aws.client

    def client(self, service):
        made = original(self, service)
        if service == "sagemaker-runtime" and not stubber:
            stubber.append(Stubber(made))
            stubber[0].add_response("invoke_endpoint", response, expected)
            stubber[0].activate()
        return made

    monkeypatch.setattr(Aws, "client", client)
    return stubber


@pytest.mark.parametrize(
    ("session", "answer", "printed"),
    [
        ("NEW_SESSION", {"NewSessionId": "sess-42; Expires=2026-12-03T10:00:00Z"}, "NewSessionId: sess-42; Expires=2026-12-03T10:00:00Z"),
        ("sess-42", {"ClosedSessionId": "sess-42"}, "ClosedSessionId: sess-42"),
    ],
)
def test_session_ids_both_ways(aws_env, cli, monkeypatch, session, answer, printed):
    body = b'{"predictions": [0]}'
    stubber = stub_runtime(
        monkeypatch,
        {"Body": StreamingBody(io.BytesIO(body), len(body)), "ContentType": "application/json", **answer},
        {"EndpointName": "chat", "Body": b'{"instances": [[1.0]]}', "ContentType": "application/json",
         "InferenceComponentName": "chat-ic", "SessionId": session},
    )
    status, out, err = cli("invoke", "--endpoint-name", "chat", "--array", "[[1]]", "--inference-component", "chat-ic", "--session-id", session)
    assert status == 0, err
    assert json.loads(out) == {"predictions": [0]}
    assert printed in err.splitlines()
    stubber[0].assert_no_pending_responses()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--target-model", "a.tar.gz", "--inference-component", "ic"],
         "error: --target-model picks a model of a multi-model endpoint and --inference-component a component; an endpoint has one or the other"),
        (["--target-model", "a.tar.gz", "--stream"],
         "error: InvokeEndpointWithResponseStream takes no --target-model (multi-model endpoints do not stream): drop --stream or --target-model"),
        (["--session-id", "not a session"],
         "error: --session-id takes NEW_SESSION or a session ID the endpoint gave (letters, digits, hyphens), got 'not a session'"),
        (["--custom-attributes", "é"], "error: --custom-attributes takes at most 1024 ASCII characters"),
    ],
)
def test_invoke_option_refusals_send_nothing(aws_env, cli, flags, message):
    aws_env.start_recording()
    status, out, err = cli("invoke", "--endpoint-name", "ep", "--array", "[[1]]", *flags)
    assert (status, out) == (1, "")
    assert one_error_line(err) == message
    assert aws_env.recorded() == []


def test_bidirectional_takes_no_routing_options(aws_env, cli, tmp_path):
    (tmp_path / "lines.jsonl").write_text('{"a": 1}\n')
    status, _, err = cli("invoke", "--endpoint-name", "ep", "--input", str(tmp_path / "lines.jsonl"), "--bidirectional", "--custom-attributes", "x")
    assert status == 1
    assert one_error_line(err) == "error: --bidirectional takes no --custom-attributes (InvokeEndpointWithBidirectionalStream has no CustomAttributes)"
