"""Private registries, serverless and asynchronous endpoints, against the moto server.

Each new flag is checked twice: in the request as it went over the wire (moto's
recorder keeps every body, read here with json, not the tool's code), and in what
moto made of it. Each refusal is one line, exit 1, and nothing created: for the
argument errors, not a single request reached AWS at all.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import requests

from tests.deploy.support import ACCOUNT, REGION, one_error_line

PRIVATE_IMAGE = "registry.example.com:5000/team/digits@sha256:" + "ab" * 32
LAMBDA = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:registry-credentials"
TOPIC = f"arn:aws:sns:{REGION}:{ACCOUNT}"


def sent(moto, target: str) -> list[dict]:
    """Bodies of the recorded JSON requests to one API action (X-Amz-Target ends with it)."""
    return [json.loads(r["raw"]) for r in moto.recorded() if r["headers"].get("X-Amz-Target", "").endswith("." + target)]


@pytest.fixture
def data(boto) -> str:
    boto("s3").create_bucket(Bucket="artifacts")
    boto("s3").put_object(Bucket="artifacts", Key="model.tar.gz", Body=b"archive")
    return "s3://artifacts/model.tar.gz"


# ---------------------------------------------------------------- private registry


def test_create_model_from_a_private_registry(aws_env, boto, cli, role, data):
    argv = ("create-model", "--model-name", "private", "--image", PRIVATE_IMAGE, "--model-data", data, "--role", role,
            "--registry", "vpc", "--registry-auth-lambda", LAMBDA, "--subnets", "subnet-0a,subnet-0b", "--subnets", "subnet-0c",
            "--security-groups", "sg-01")
    aws_env.start_recording()
    status, out, err = cli(*argv)
    assert status == 0, err
    [request] = sent(aws_env, "CreateModel")
    assert request == {
        "ModelName": "private",
        "ExecutionRoleArn": role,
        "PrimaryContainer": {
            "Image": PRIVATE_IMAGE,  # as given: no ECR lookup for another registry
            "Environment": {},
            "ModelDataUrl": data,
            "ImageConfig": {"RepositoryAccessMode": "Vpc", "RepositoryAuthConfig": {"RepositoryCredentialsProviderArn": LAMBDA}},
        },
        "VpcConfig": {"SecurityGroupIds": ["sg-01"], "Subnets": ["subnet-0a", "subnet-0b", "subnet-0c"]},
    }
    assert sent(aws_env, "DescribeImages") == []
    described = boto("sagemaker").describe_model(ModelName="private")
    assert described["ModelArn"] == out.strip()
    assert described["PrimaryContainer"]["ImageConfig"] == request["PrimaryContainer"]["ImageConfig"]
    assert described["VpcConfig"] == request["VpcConfig"]

    # Again, with the same settings in another order: nothing new.
    status, again, err = cli(*argv[:-6], "--subnets", "subnet-0c,subnet-0b,subnet-0a", "--security-groups", "sg-01")
    assert status == 0 and again == out, err
    assert "exists with these settings" in err
    # Without the registry settings it is another model, which cannot replace this one.
    status, _, err = cli("create-model", "--model-name", "private", "--image", PRIVATE_IMAGE, "--model-data", data, "--role", role,
                         "--registry", "vpc", "--subnets", "subnet-0a", "--security-groups", "sg-01")
    assert status == 1
    assert one_error_line(err).startswith("error: model private exists with a different image, data, environment, role or network")


def test_an_ecr_model_may_still_run_in_a_vpc(aws_env, boto, cli, role, image, data):
    aws_env.start_recording()
    status, _, err = cli("create-model", "--model-name", "isolated", "--image", image, "--model-data", data, "--role", role,
                         "--subnets", "subnet-0a", "--security-groups", "sg-01,sg-02")
    assert status == 0, err
    [request] = sent(aws_env, "CreateModel")
    assert "ImageConfig" not in request["PrimaryContainer"]  # Platform, SageMaker's default
    assert request["PrimaryContainer"]["Image"].startswith(f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/sagemaker-pytorch-byoc@sha256:")
    assert request["VpcConfig"] == {"SecurityGroupIds": ["sg-01", "sg-02"], "Subnets": ["subnet-0a"]}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--image", PRIVATE_IMAGE, "--registry", "vpc"],
         "error: --registry vpc needs --subnets and --security-groups: SageMaker pulls a private registry's image from the model's VPC"),
        (["--image", PRIVATE_IMAGE, "--registry", "vpc", "--subnets", "subnet-0a"],
         "error: --subnets and --security-groups go together (they are the model's VpcConfig)"),
        (["--image", PRIVATE_IMAGE],
         f"error: image {PRIVATE_IMAGE} is not in ECR; SageMaker pulls other registries only through your VPC: pass --registry vpc "
         "with --subnets and --security-groups (and --registry-auth-lambda if it needs a login)"),
        (["--image", "docker.io/library/python:3.11"],
         "error: image docker.io/library/python:3.11 is not in ECR; SageMaker pulls other registries only through your VPC: pass "
         "--registry vpc with --subnets and --security-groups (and --registry-auth-lambda if it needs a login)"),
        (["--image", PRIVATE_IMAGE, "--registry-auth-lambda", LAMBDA],
         "error: --registry-auth-lambda applies to a private registry: add --registry vpc"),
        (["--image", PRIVATE_IMAGE, "--registry", "vpc", "--subnets", "subnet-0a", "--security-groups", "sg-01", "--registry-auth-lambda", "creds"],
         "error: --registry-auth-lambda must be a Lambda function ARN (arn:aws:lambda:REGION:ACCOUNT:function:NAME), got 'creds'"),
        (["--image", PRIVATE_IMAGE, "--registry", "vpc", "--subnets", "vpc-0a", "--security-groups", "sg-01"],
         "error: --subnets takes subnet-... IDs, got 'vpc-0a'"),
    ],
)
def test_model_refusals_create_nothing(aws_env, boto, cli, role, data, flags, message):
    aws_env.start_recording()
    status, out, err = cli("create-model", "--model-name", "m", "--model-data", data, "--role", role, *flags)
    assert (status, out) == (1, "")
    assert one_error_line(err) == message
    assert aws_env.recorded() == []  # refused before a single AWS call
    assert boto("sagemaker").list_models()["Models"] == []


# ---------------------------------------------------------------- serverless


SERVERLESS = ("create-endpoint", "--endpoint-name", "sl", "--model-name", "digits", "--poll-seconds", "0.1")


def test_serverless_endpoint(aws_env, boto, cli, model):
    aws_env.start_recording()
    status, out, err = cli(*SERVERLESS, "--serverless-memory", "3072", "--serverless-max-concurrency", "12")
    assert status == 0, err
    assert out.startswith("sl InService arn:aws:sagemaker:")
    [request] = sent(aws_env, "CreateEndpointConfig")
    # No instance type, count, AMI or timeouts: ServerlessConfig alone sizes it.
    assert request["ProductionVariants"] == [
        {"VariantName": "AllTraffic", "ModelName": "digits", "ServerlessConfig": {"MemorySizeInMB": 3072, "MaxConcurrency": 12}}]
    assert "AsyncInferenceConfig" not in request
    sagemaker = boto("sagemaker")
    config = sagemaker.describe_endpoint_config(EndpointConfigName=sagemaker.describe_endpoint(EndpointName="sl")["EndpointConfigName"])
    assert config["ProductionVariants"][0]["ServerlessConfig"] == {"MemorySizeInMB": 3072, "MaxConcurrency": 12}

    status, _, err = cli(*SERVERLESS, "--serverless-memory", "2048")
    assert status == 1  # another config for an existing endpoint: update-endpoint's job
    assert "use update-endpoint to change it" in one_error_line(err)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--instance-type", "ml.g5.xlarge"],
         "error: serverless endpoints have no GPU: drop --instance-type ml.g5.xlarge, or drop --serverless-memory to run on ml.g5.xlarge"),
        (["--inference-ami-version", "al2023-ami-sagemaker-inference-gpu-4-1"],
         "error: --inference-ami-version selects a GPU driver, and serverless endpoints have no GPU: drop it or --serverless-memory"),
        (["--instance-type", "ml.m5.large"],
         "error: --instance-type applies to instance-based endpoints; serverless endpoints size themselves with --serverless-memory and --serverless-max-concurrency"),
        (["--instance-count", "2"],
         "error: --instance-count applies to instance-based endpoints; serverless endpoints size themselves with --serverless-memory and --serverless-max-concurrency"),
        (["--volume-gb", "30"],
         "error: --volume-gb applies to instance-based endpoints; serverless endpoints size themselves with --serverless-memory and --serverless-max-concurrency"),
        (["--autoscale"],
         "error: --autoscale registers instance scaling; serverless endpoints scale themselves up to --serverless-max-concurrency"),
        (["--async-output", "s3://out/results"], "error: asynchronous endpoints run on instances; drop --serverless-memory or --async-output"),
    ],
)
def test_serverless_refusals_create_nothing(aws_env, boto, cli, model, flags, message):
    aws_env.start_recording()
    status, out, err = cli(*SERVERLESS, "--serverless-memory", "2048", *flags)
    assert (status, out) == (1, "")
    assert one_error_line(err) == message
    assert aws_env.recorded() == []
    assert boto("sagemaker").list_endpoint_configs()["EndpointConfigs"] == []
    assert boto("sagemaker").list_endpoints()["Endpoints"] == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--serverless-memory", "1000"], "error: --serverless-memory must be one of 1024, 2048, 3072, 4096, 5120, 6144 (MB), got 1000"),
        (["--serverless-memory", "1024", "--serverless-max-concurrency", "201"], "error: --serverless-max-concurrency must be 1..200, got 201"),
        (["--serverless-max-concurrency", "4"], "error: --serverless-max-concurrency needs --serverless-memory"),
    ],
)
def test_serverless_sizes_are_checked(aws_env, boto, cli, model, flags, message):
    status, _, err = cli(*SERVERLESS, *flags)
    assert status == 1 and one_error_line(err) == message


def test_serverless_refuses_a_model_in_a_vpc(aws_env, boto, cli, role, data):
    status, _, err = cli("create-model", "--model-name", "private", "--image", PRIVATE_IMAGE, "--model-data", data, "--role", role,
                         "--registry", "vpc", "--subnets", "subnet-0a", "--security-groups", "sg-01")
    assert status == 0, err
    status, out, err = cli("create-endpoint", "--endpoint-name", "sl", "--model-name", "private", "--serverless-memory", "2048")
    assert (status, out) == (1, "")
    assert one_error_line(err) == (
        "error: model private pulls from a private registry (--registry vpc), which serverless endpoints cannot use; "
        "push the image to ECR and create a model without --registry vpc"
    )
    assert boto("sagemaker").list_endpoint_configs()["EndpointConfigs"] == []
    assert boto("sagemaker").list_endpoints()["Endpoints"] == []


# ---------------------------------------------------------------- asynchronous


ASYNC = ("create-endpoint", "--endpoint-name", "batchy", "--model-name", "digits", "--poll-seconds", "0.1", "--instance-type", "ml.c5.xlarge")


def test_async_endpoint_with_scale_to_zero(aws_env, boto, cli, model):
    aws_env.start_recording()
    status, out, err = cli(*ASYNC, "--async-output", "s3://out/results", "--async-failure", "s3://out/failures",
                           "--sns-success", f"{TOPIC}:done", "--sns-error", f"{TOPIC}:failed", "--max-concurrent-invocations-per-instance", "4",
                           "--autoscale", "--min-instances", "0", "--max-instances", "3", "--target-backlog", "8")
    assert status == 0, err
    [config] = sent(aws_env, "CreateEndpointConfig")
    assert config["AsyncInferenceConfig"] == {
        "OutputConfig": {
            "S3OutputPath": "s3://out/results",
            "S3FailurePath": "s3://out/failures",
            "NotificationConfig": {"SuccessTopic": f"{TOPIC}:done", "ErrorTopic": f"{TOPIC}:failed"},
        },
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 4},
    }
    assert config["ProductionVariants"][0]["InstanceType"] == "ml.c5.xlarge"
    described = boto("sagemaker").describe_endpoint_config(EndpointConfigName=config["EndpointConfigName"])
    assert described["AsyncInferenceConfig"] == config["AsyncInferenceConfig"]

    rid = "endpoint/batchy/variant/AllTraffic"
    [target] = sent(aws_env, "RegisterScalableTarget")
    assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == (rid, 0, 3)
    tracking, step = sent(aws_env, "PutScalingPolicy")
    assert tracking["TargetTrackingScalingPolicyConfiguration"] == {
        "TargetValue": 8.0,
        "CustomizedMetricSpecification": {"MetricName": "ApproximateBacklogSizePerInstance", "Namespace": "AWS/SageMaker",
                                          "Dimensions": [{"Name": "EndpointName", "Value": "batchy"}], "Statistic": "Average"},
        "ScaleInCooldown": 300,
        "ScaleOutCooldown": 60,
    }
    # From zero, target tracking has nothing to average: a step policy adds the first instance.
    assert (step["PolicyName"], step["PolicyType"]) == ("batchy-has-backlog-without-capacity", "StepScaling")
    assert step["StepScalingPolicyConfiguration"]["StepAdjustments"] == [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}]
    # CloudWatch's wire protocol is not JSON with X-Amz-Target: read the alarm from moto.
    [alarm] = boto("cloudwatch").describe_alarms(AlarmNames=["batchy-has-backlog-without-capacity"])["MetricAlarms"]
    step_arn = [p for p in boto("application-autoscaling").describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=rid)["ScalingPolicies"]
                if p["PolicyType"] == "StepScaling"][0]["PolicyARN"]
    assert alarm["MetricName"] == "HasBacklogWithoutCapacity" and alarm["Namespace"] == "AWS/SageMaker"
    assert alarm["Dimensions"] == [{"Name": "EndpointName", "Value": "batchy"}]
    assert alarm["AlarmActions"] == [step_arn]
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1.0)

    # teardown removes the alarm along with the scaling it served.
    status, out, err = cli("teardown", "--endpoint-name", "batchy", "--poll-seconds", "0.1")
    assert status == 0, err
    assert "alarm batchy-has-backlog-without-capacity: deleted" in out.splitlines()
    assert boto("cloudwatch").describe_alarms(AlarmNames=["batchy-has-backlog-without-capacity"])["MetricAlarms"] == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sns-success", f"{TOPIC}:done"], "error: --sns-success configures an asynchronous endpoint: add --async-output s3://BUCKET/PREFIX"),
        (["--autoscale", "--min-instances", "0"],
         "error: --min-instances 0 (scale to zero) is for asynchronous endpoints (--async-output) and inference components; "
         "real-time endpoints keep at least one instance"),
        (["--async-output", "out/results"], "error: --async-output must be an s3://bucket/prefix URI, got 'out/results'"),
        (["--async-output", "s3://out/r", "--sns-error", "topic"], "error: --sns-error must be an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME), got 'topic'"),
    ],
)
def test_async_refusals_create_nothing(aws_env, boto, cli, model, flags, message):
    aws_env.start_recording()
    status, out, err = cli(*ASYNC, *flags)
    assert (status, out) == (1, "")
    assert one_error_line(err) == message
    assert aws_env.recorded() == []
    assert boto("sagemaker").list_endpoint_configs()["EndpointConfigs"] == []


# ---------------------------------------------------------------- invoke-async


def script_async(moto, *results: dict) -> None:
    body = {"account_id": ACCOUNT, "region": REGION, "results": list(results)}
    requests.post(f"{moto.url}/moto-api/static/sagemaker/async-endpoint-results", json=body, timeout=10).raise_for_status()


def test_invoke_async_uploads_invokes_and_waits(aws_env, boto, cli, tmp_path):
    boto("s3").create_bucket(Bucket="inputs")
    request = tmp_path / "digits.json"
    request.write_bytes(b'{"instances": [[0, 1, 2]]}')
    key = f"async-inputs/{hashlib.sha256(request.read_bytes()).hexdigest()[:16]}/digits.json"
    script_async(aws_env, {"data": json.dumps({"predictions": [[0.25, 0.75]]})})
    aws_env.start_recording()
    status, out, err = cli("invoke-async", "--endpoint-name", "batchy", "--input", str(request), "--bucket", "inputs",
                           "--accept", "application/json", "--inference-id", "req-1", "--invocation-timeout", "3600",
                           "--request-ttl", "600", "--wait", "--poll-seconds", "0.1")
    assert status == 0, err
    assert json.loads(out) == {"predictions": [[0.25, 0.75]]}

    [call] = [r for r in aws_env.recorded() if r["url"].endswith("/endpoints/batchy/async-invocations")]
    headers = {name.lower(): value for name, value in call["headers"].items()}  # the recorder re-cases names
    assert headers["x-amzn-sagemaker-inputlocation"] == f"s3://inputs/{key}"
    assert headers["x-amzn-sagemaker-content-type"] == "application/json"
    assert headers["x-amzn-sagemaker-accept"] == "application/json"
    assert headers["x-amzn-sagemaker-inference-id"] == "req-1"
    assert headers["x-amzn-sagemaker-invocationtimeoutseconds"] == "3600"
    assert headers["x-amzn-sagemaker-requestttlseconds"] == "600"
    assert call["raw"] == b""  # the body travels through S3, not in the call
    uploaded = boto("s3").get_object(Bucket="inputs", Key=key)
    assert uploaded["Body"].read() == request.read_bytes() and uploaded["ContentType"] == "application/json"


def test_invoke_async_without_wait_prints_the_output_location(aws_env, boto, cli):
    boto("s3").create_bucket(Bucket="inputs")
    boto("s3").put_object(Bucket="inputs", Key="rows.csv", Body=b"1,2\n")
    status, out, err = cli("invoke-async", "--endpoint-name", "batchy", "--input", "s3://inputs/rows.csv")
    assert status == 0, err
    assert out.startswith("s3://sagemaker-output-") and out.strip().endswith("/response.json")
    assert "queued; its result will be" in err


def test_invoke_async_failure_is_one_line(aws_env, boto, cli):
    boto("s3").create_bucket(Bucket="inputs")
    boto("s3").put_object(Bucket="inputs", Key="x.npy", Body=b"\x93NUMPY")
    script_async(aws_env, {"is_failure": True, "data": "ModelError: the request body was not a valid npy\nat line 2"})
    status, out, err = cli("invoke-async", "--endpoint-name", "batchy", "--input", "s3://inputs/x.npy", "--wait", "--poll-seconds", "0.1")
    assert (status, out) == (1, "")
    line = one_error_line(err)
    assert line.startswith("error: the asynchronous inference failed: ModelError: the request body was not a valid npy at line 2 (s3://")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--input", "s3://inputs/missing.json"], "error: --input s3://inputs/missing.json does not exist"),
        (["--input", "s3://inputs/blob"], "error: cannot tell the content type of s3://inputs/blob; pass --content-type"),
        (["--input", "s3://inputs/x.json", "--invocation-timeout", "7200"], "error: --invocation-timeout must be 1..3600 seconds, got 7200"),
    ],
)
def test_invoke_async_refusals(aws_env, boto, cli, argv, message):
    boto("s3").create_bucket(Bucket="inputs")
    status, _, err = cli("invoke-async", "--endpoint-name", "batchy", *argv)
    assert status == 1 and one_error_line(err) == message
