"""Every failure is one line on stderr and exit status 1, never a traceback.

Failed endpoints and transform jobs: moto creates both straight into their final good
state and has no API to make one fail, so these tests set the status in moto's
backend (the server runs in this process) while the tool is polling, the way
SageMaker moves a resource from Creating to Failed.
"""

from __future__ import annotations

import json
import threading

import pytest

from tests.deploy.support import ACCOUNT, REGION, Moto, run_module

IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/sagemaker-pytorch-byoc:v1"


def one_error_line(err: str) -> str:
    assert "Traceback" not in err
    assert err.count("error:") == 1, err
    last = err.splitlines()[-1]
    assert last.startswith("error: "), err
    return last


@pytest.fixture
def image(boto) -> str:
    ecr = boto("ecr")
    ecr.create_repository(repositoryName="sagemaker-pytorch-byoc")
    ecr.put_image(repositoryName="sagemaker-pytorch-byoc", imageTag="v1",
                  imageManifest=json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                                             "layers": [{"digest": "sha256:" + "2" * 64}]}))
    return IMAGE


@pytest.fixture
def model(cli, boto, role, image) -> str:
    boto("s3").create_bucket(Bucket="artifacts")
    boto("s3").put_object(Bucket="artifacts", Key="model.tar.gz", Body=b"archive")
    status, _, err = cli("create-model", "--model-name", "digits", "--image", image, "--model-data", "s3://artifacts/model.tar.gz", "--role", role)
    assert status == 0, err
    return "digits"


def later(seconds: float, change) -> threading.Timer:
    timer = threading.Timer(seconds, change)
    timer.start()
    return timer


# ---------------------------------------------------------------- environment


def test_missing_credentials(aws_env, model_dir):
    result = run_module("package", str(model_dir), env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""})
    assert result.returncode == 1 and result.stdout == ""
    assert one_error_line(result.stderr).startswith("error: no AWS credentials")


def test_missing_region(aws_env, model_dir):
    result = run_module("package", str(model_dir), env={"AWS_DEFAULT_REGION": "", "AWS_REGION": ""})
    assert result.returncode == 1 and result.stdout == ""
    assert one_error_line(result.stderr) == "error: no AWS region: pass --region or set AWS_REGION (or AWS_DEFAULT_REGION)"


def test_aws_region_is_honoured(aws_env, boto, model_dir):
    # botocore itself reads only AWS_DEFAULT_REGION; the tool also reads AWS_REGION.
    boto("s3").create_bucket(Bucket="artifacts")
    result = run_module("package", str(model_dir), "--bucket", "artifacts", env={"AWS_DEFAULT_REGION": "", "AWS_REGION": REGION})
    assert result.returncode == 0, result.stderr


def test_endpoint_url_option(aws_env, boto, cli, model_dir, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    boto("s3").create_bucket(Bucket="artifacts")
    status, out, err = cli("package", str(model_dir), "--bucket", "artifacts", "--endpoint-url", aws_env.url)
    assert status == 0, err
    assert out.startswith("s3://artifacts/models/")


def test_unreachable_endpoint(aws_env, model_dir):
    result = run_module("package", str(model_dir), "--bucket", "artifacts", "--endpoint-url", "http://127.0.0.1:9")
    assert result.returncode == 1
    assert one_error_line(result.stderr).startswith("error: cannot reach the AWS endpoint")


# ---------------------------------------------------------------- package


def test_package_missing_directory(aws_env, cli, tmp_path):
    status, out, err = cli("package", str(tmp_path / "nope"))
    assert (status, out) == (1, "")
    assert one_error_line(err).startswith(f"error: model directory {tmp_path / 'nope'} does not exist")


def test_package_missing_bucket_then_create_it(aws_env, boto, cli, model_dir):
    status, _, err = cli("package", str(model_dir))
    assert status == 1
    default = f"sagemaker-{REGION}-{ACCOUNT}"
    assert one_error_line(err) == f"error: bucket {default} does not exist; create it or pass --create-bucket"
    status, out, err = cli("package", str(model_dir), "--create-bucket")
    assert status == 0, err
    assert out.startswith(f"s3://{default}/models/")
    assert boto("s3").head_object(Bucket=default, Key=out.strip().removeprefix(f"s3://{default}/"))["ContentLength"] > 0


# ---------------------------------------------------------------- create-model


def test_missing_role(aws_env, cli, image):
    status, _, err = cli("create-model", "--model-name", "m", "--image", image)
    assert status == 1
    assert one_error_line(err).startswith("error: no execution role: pass --role")


def test_role_that_does_not_exist(aws_env, cli, image):
    arn = f"arn:aws:iam::{ACCOUNT}:role/NoSuchRole"
    status, _, err = cli("create-model", "--model-name", "m", "--image", image, "--role", arn)
    assert status == 1
    assert one_error_line(err) == f"error: execution role {arn} does not exist"


def test_role_from_environment(aws_env, boto, cli, role, image, monkeypatch):
    monkeypatch.setenv("SAGEMAKER_ROLE_ARN", role)
    status, _, err = cli("create-model", "--model-name", "m", "--image", image)
    assert status == 0, err
    assert boto("sagemaker").describe_model(ModelName="m")["ExecutionRoleArn"] == role


def test_missing_image(aws_env, cli, role, image):
    missing = image.replace(":v1", ":v2")
    status, _, err = cli("create-model", "--model-name", "m", "--image", missing, "--role", role)
    assert status == 1
    assert one_error_line(err) == f"error: image {missing} not found in ECR; push it first (python -m deploy push)"


def test_missing_model_data(aws_env, boto, cli, role, image):
    boto("s3").create_bucket(Bucket="artifacts")
    status, _, err = cli("create-model", "--model-name", "m", "--image", image, "--role", role, "--model-data", "s3://artifacts/none.tar.gz")
    assert status == 1
    assert one_error_line(err).startswith("error: model data s3://artifacts/none.tar.gz does not exist")


def test_model_with_other_settings_exists(aws_env, cli, model, role, image):
    status, _, err = cli("create-model", "--model-name", model, "--image", image, "--model-data", "s3://artifacts/model.tar.gz",
                         "--role", role, "--env", "SAGEMAKER_MODEL_SERVER_WORKERS=2")
    assert status == 1
    assert one_error_line(err).startswith(f"error: model {model} exists with a different image, data, environment or role")


def test_bad_env_pair(aws_env, cli, role, image):
    status, _, err = cli("create-model", "--model-name", "m", "--image", image, "--role", role, "--env", "NOEQUALS")
    assert status == 1
    assert one_error_line(err) == "error: --env takes KEY=VALUE, got 'NOEQUALS'"


# ---------------------------------------------------------------- endpoints


def test_failed_endpoint_reports_its_failure_reason(aws_env, cli, model):
    """The endpoint goes Creating -> Failed while the tool waits on it."""
    backend = Moto.sagemaker_backend()
    original = backend.create_endpoint

    def create_then_fail(**kwargs):
        endpoint = original(**kwargs)
        endpoint.endpoint_status = "Creating"

        def fail():
            endpoint.endpoint_status = "Failed"
            endpoint.failure_reason = "The primary container for production variant AllTraffic did not pass the ping health check."

        later(0.5, fail)
        return endpoint

    backend.create_endpoint = create_then_fail
    try:
        status, out, err = cli("create-endpoint", "--endpoint-name", "ep", "--model-name", model, "--poll-seconds", "0.1")
    finally:
        backend.create_endpoint = original
    assert (status, out) == (1, "")
    assert "endpoint ep: Creating" in err  # progress while it waited
    assert one_error_line(err) == (
        "error: endpoint ep is Failed: The primary container for production variant AllTraffic did not pass the ping health check."
    )


def test_wait_gives_up_after_max_wait(aws_env, cli, model):
    status, _, err = cli("create-endpoint", "--endpoint-name", "ep", "--model-name", model, "--poll-seconds", "0.1")
    assert status == 0, err
    Moto.sagemaker_backend().endpoints["ep"].endpoint_status = "Updating"
    status, _, err = cli("create-endpoint", "--endpoint-name", "ep", "--model-name", model, "--poll-seconds", "0.1", "--max-wait", "0.5")
    assert status == 1
    assert one_error_line(err).startswith("error: endpoint ep is still Updating after")


def test_create_endpoint_refuses_to_change_an_existing_one(aws_env, cli, model):
    assert cli("create-endpoint", "--endpoint-name", "ep", "--model-name", model, "--poll-seconds", "0.1")[0] == 0
    status, _, err = cli("create-endpoint", "--endpoint-name", "ep", "--model-name", model, "--instance-count", "2", "--poll-seconds", "0.1")
    assert status == 1
    assert one_error_line(err).endswith("use update-endpoint to change it")


def test_endpoint_needs_its_model(aws_env, cli):
    status, _, err = cli("create-endpoint", "--endpoint-name", "ep", "--model-name", "nope")
    assert status == 1
    assert one_error_line(err) == "error: model nope does not exist; run create-model first"


def test_ami_version_is_checked_against_the_service_model(aws_env, cli, model):
    status, _, err = cli("create-endpoint", "--endpoint-name", "ep", "--model-name", model, "--instance-type", "ml.g4dn.xlarge",
                         "--inference-ami-version", "al2-ami-sagemaker-inference-gpu-9")
    assert status == 1
    line = one_error_line(err)
    assert line.startswith("error: InferenceAmiVersion 'al2-ami-sagemaker-inference-gpu-9' is not one of: ")
    assert "al2023-ami-sagemaker-inference-gpu-4-1" in line
    status, _, err = cli("create-endpoint", "--endpoint-name", "ep", "--model-name", model, "--instance-type", "ml.m5.large",
                         "--inference-ami-version", "al2023-ami-sagemaker-inference-gpu-4-1")
    assert status == 1
    assert "applies to GPU instance types" in one_error_line(err)


def test_cpu_endpoint_has_no_ami_version(aws_env, boto, cli, model):
    status, _, err = cli("create-endpoint", "--endpoint-name", "ep", "--model-name", model, "--instance-type", "ml.m5.large", "--poll-seconds", "0.1")
    assert status == 0, err
    sagemaker = boto("sagemaker")
    config = sagemaker.describe_endpoint_config(EndpointConfigName=sagemaker.describe_endpoint(EndpointName="ep")["EndpointConfigName"])
    assert "InferenceAmiVersion" not in config["ProductionVariants"][0]


def test_update_endpoint(aws_env, boto, cli, model):
    """What moto can show of an update: the new config; moto has no UpdateEndpoint itself."""
    status, _, err = cli("update-endpoint", "--endpoint-name", "ep", "--model-name", model)
    assert status == 1
    assert one_error_line(err) == "error: endpoint ep does not exist; use create-endpoint"

    base = ("--endpoint-name", "ep", "--model-name", model, "--poll-seconds", "0.1")
    assert cli("create-endpoint", *base, "--autoscale")[0] == 0
    status, out, err = cli("update-endpoint", *base)  # same settings: nothing to do
    assert status == 0, err
    assert "already uses" in err and out.startswith("ep InService ")

    sagemaker = boto("sagemaker")
    status, out, err = cli("update-endpoint", *base, "--instance-count", "3")
    configs = {c["EndpointConfigName"] for c in sagemaker.list_endpoint_configs()["EndpointConfigs"]}
    [new] = configs - {sagemaker.describe_endpoint(EndpointName="ep")["EndpointConfigName"]}
    assert sagemaker.describe_endpoint_config(EndpointConfigName=new)["ProductionVariants"][0]["InitialInstanceCount"] == 3
    # The scaling target had to go before the instance count could change.
    assert boto("application-autoscaling").describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    if status != 0:  # moto 5.2.5 answers UpdateEndpoint with a 500
        assert one_error_line(err).startswith("error: UpdateEndpoint failed")


# ---------------------------------------------------------------- transform


def test_failed_transform_job_reports_its_failure_reason(aws_env, boto, cli, model):
    backend = Moto.sagemaker_backend()
    original = backend.create_transform_job

    def create_then_fail(**kwargs):
        job = original(**kwargs)
        job.transform_job_status = "InProgress"

        def fail():
            job.transform_job_status = "Failed"
            job.failure_reason = "ClientError: See job logs for more information"

        later(0.5, fail)
        return job

    backend.create_transform_job = create_then_fail
    try:
        status, out, err = cli("transform", "--model-name", model, "--input", "s3://artifacts/in/", "--output", "s3://artifacts/out/",
                               "--poll-seconds", "0.1")
    finally:
        backend.create_transform_job = original
    assert (status, out) == (1, "")
    assert "InProgress" in err
    line = one_error_line(err)
    assert line.startswith("error: transform job digits-")
    assert line.endswith(" is Failed: ClientError: See job logs for more information (after fixing it, rerun with a new --job-name)")


def test_transform_needs_its_model(aws_env, cli):
    status, _, err = cli("transform", "--model-name", "nope", "--input", "s3://a/in", "--output", "s3://a/out")
    assert status == 1
    assert one_error_line(err) == "error: model nope does not exist; run create-model first"


def test_transform_no_wait_and_defaults(aws_env, boto, cli, model):
    status, out, err = cli("transform", "--model-name", model, "--input", "s3://artifacts/in/", "--output", "s3://artifacts/out/", "--no-wait")
    assert status == 0, err
    assert out == "s3://artifacts/out/\n"
    sagemaker = boto("sagemaker")
    [summary] = sagemaker.list_transform_jobs()["TransformJobSummaries"]
    job = sagemaker.describe_transform_job(TransformJobName=summary["TransformJobName"])
    # Without --max-concurrent-transforms SageMaker asks the container's /execution-parameters.
    assert "MaxConcurrentTransforms" not in job
    assert "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS" not in job["Environment"]
    assert "DataProcessing" not in job
    assert job["ModelClientConfig"] == {"InvocationsTimeoutInSeconds": 600, "InvocationsMaxRetries": 1}


# ---------------------------------------------------------------- teardown


def test_teardown_needs_a_target(aws_env, cli):
    status, _, err = cli("teardown")
    assert status == 1
    assert one_error_line(err) == "error: teardown needs --endpoint-name and/or --model-name"


def test_gpu_transform_gets_a_batch_ami(aws_env, boto, cli, model):
    status, _, err = cli("transform", "--model-name", model, "--input", "s3://artifacts/in/", "--output", "s3://artifacts/gpu-out/",
                         "--instance-type", "ml.g4dn.xlarge", "--no-wait")
    assert status == 0, err
    sagemaker = boto("sagemaker")
    [summary] = sagemaker.list_transform_jobs()["TransformJobSummaries"]
    resources = sagemaker.describe_transform_job(TransformJobName=summary["TransformJobName"])["TransformResources"]
    assert resources == {"InstanceType": "ml.g4dn.xlarge", "InstanceCount": 1, "TransformAmiVersion": "al2-ami-sagemaker-batch-gpu-535"}
    status, _, err = cli("transform", "--model-name", model, "--input", "s3://a/in/", "--output", "s3://a/out/",
                         "--transform-ami-version", "al2-ami-sagemaker-batch-gpu-535")
    assert status == 1
    assert "applies to GPU instance types" in one_error_line(err)
