"""Every failure is one line on stderr and exit status 1, never a traceback.

Failed endpoints and transform jobs: moto creates both straight into their final good
state and has no API to make one fail, so these tests set the status in moto's
backend (the server runs in this process) while the tool is polling, the way
SageMaker moves a resource from Creating to Failed.
"""

from __future__ import annotations

import json

import pytest

from tests.deploy.support import ACCOUNT, REGION, Moto, add_update_endpoint, one_error_line, run_module

def after_first_look(backend, describe: str, change) -> None:
    """change() once the tool has seen the resource's state (backend.<describe> answered
    once): the state it moves from is in the tool's output however slow its polls."""
    original = getattr(backend, describe)

    def described(*args, **kwargs):
        answer = original(*args, **kwargs)  # (a dict made now: what the tool sees)
        setattr(backend, describe, original)
        change()
        return answer

    setattr(backend, describe, described)


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


@pytest.mark.parametrize(
    ("media_type", "kind"),
    [("application/vnd.oci.image.manifest.v1+json", "an OCI manifest"), ("application/vnd.oci.image.index.v1+json", "an OCI image index")],
)
def test_oci_image_is_refused_before_create_model(aws_env, boto, cli, role, media_type, kind):
    """SageMaker's CreateModel rejects OCI manifests and indexes; say how to rebuild instead."""
    ecr = boto("ecr")
    ecr.create_repository(repositoryName="sagemaker-pytorch-byoc")
    ecr.put_image(repositoryName="sagemaker-pytorch-byoc", imageTag="oci", imageManifestMediaType=media_type,
                  imageManifest=json.dumps({"schemaVersion": 2, "layers": [{"digest": "sha256:" + "4" * 64}]}))
    image = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/sagemaker-pytorch-byoc:oci"
    status, _, err = cli("create-model", "--model-name", "m", "--image", image, "--role", role)
    assert status == 1
    assert one_error_line(err) == (
        f"error: image {image} has {kind} ({media_type}), which SageMaker rejects; rebuild it with "
        "`podman build --format docker` or `docker build --provenance=false` (make build does) and push again"
    )
    assert boto("sagemaker").list_models()["Models"] == []


def test_missing_model_data(aws_env, boto, cli, role, image):
    boto("s3").create_bucket(Bucket="artifacts")
    status, _, err = cli("create-model", "--model-name", "m", "--image", image, "--role", role, "--model-data", "s3://artifacts/none.tar.gz")
    assert status == 1
    assert one_error_line(err).startswith("error: model data s3://artifacts/none.tar.gz does not exist")


def test_model_with_other_settings_exists(aws_env, cli, model, role, image):
    status, _, err = cli("create-model", "--model-name", model, "--image", image, "--model-data", "s3://artifacts/model.tar.gz",
                         "--role", role, "--env", "SAGEMAKER_MODEL_SERVER_WORKERS=2")
    assert status == 1
    assert one_error_line(err).startswith(f"error: model {model} exists with a different image, data, environment, role or network")


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

        after_first_look(backend, "describe_endpoint", fail)
        return endpoint

    backend.create_endpoint = create_then_fail
    try:
        status, out, err = cli("create-endpoint", "--endpoint-name", "ep", "--model-name", model, "--poll-seconds", "0.1")
    finally:
        backend.create_endpoint = original
        vars(backend).pop("describe_endpoint", None)
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


def test_update_endpoint(aws_env, boto, cli, model, monkeypatch):
    """A new instance count: a new config, waited until InService, autoscaling kept."""
    updates = add_update_endpoint(monkeypatch)
    status, _, err = cli("update-endpoint", "--endpoint-name", "ep", "--model-name", model)
    assert status == 1
    assert one_error_line(err) == "error: endpoint ep does not exist; use create-endpoint"

    base = ("--endpoint-name", "ep", "--model-name", model, "--poll-seconds", "0.1")
    assert cli("create-endpoint", *base, "--autoscale")[0] == 0
    status, out, err = cli("update-endpoint", *base)  # same settings: nothing to do
    assert status == 0, err
    assert "already uses" in err and out.startswith("ep InService ")
    assert updates == []

    sagemaker = boto("sagemaker")
    old = sagemaker.describe_endpoint(EndpointName="ep")["EndpointConfigName"]
    status, out, err = cli("update-endpoint", *base, "--instance-count", "3")
    assert status == 0, err
    assert out.startswith("ep InService ")
    assert "endpoint ep: Updating" in err  # it waited for the update
    new = sagemaker.describe_endpoint(EndpointName="ep")["EndpointConfigName"]
    assert new != old
    assert sagemaker.describe_endpoint_config(EndpointConfigName=new)["ProductionVariants"][0]["InitialInstanceCount"] == 3
    # AWS lets an instance count change under autoscaling: the target stays, untouched.
    assert updates == [{"EndpointName": "ep", "EndpointConfigName": new, "ScalableTargets": ["endpoint/ep/variant/AllTraffic"]}]
    [target] = boto("application-autoscaling").describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == ("endpoint/ep/variant/AllTraffic", 1, 2)
    assert "deregistered" not in err


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

        after_first_look(backend, "describe_transform_job", fail)
        return job

    backend.create_transform_job = create_then_fail
    try:
        status, out, err = cli("transform", "--model-name", model, "--input", "s3://artifacts/in/", "--output", "s3://artifacts/out/",
                               "--poll-seconds", "0.1")
    finally:
        backend.create_transform_job = original
        vars(backend).pop("describe_transform_job", None)
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
    assert job["ModelClientConfig"] == {"InvocationsTimeoutInSeconds": 600, "InvocationsMaxRetries": 3}  # SageMaker's and local_test's default


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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-payload-mb", "0"], "error: --max-payload-mb must be 1..100, got 0"),
        (["--max-payload-mb", "150"], "error: --max-payload-mb must be 1..100, got 150"),
        (["--max-payload-mb", "30", "--max-concurrent-transforms", "4"],
         "error: --max-concurrent-transforms x --max-payload-mb must be at most 100 MB, got 4 x 30"),
        (["--content-type", "application/x-npy", "--split-type", "Line"],
         "error: --content-type application/x-npy cannot be split into lines; pass --split-type None (one array per file)"),
    ],
)
def test_transform_arguments_are_checked_before_any_call(aws_env, boto, cli, model, argv, message):
    aws_env.start_recording()
    status, out, err = cli("transform", "--model-name", model, "--input", "s3://artifacts/in/", "--output", "s3://artifacts/out/",
                           "--no-wait", *argv)
    recorded = aws_env.recorded()
    assert (status, out) == (1, "")
    assert one_error_line(err) == message
    assert recorded == []  # refused before talking to AWS at all
    assert boto("sagemaker").list_transform_jobs()["TransformJobSummaries"] == []


def test_transform_limits_that_fit_are_taken(aws_env, boto, cli, model):
    status, _, err = cli("transform", "--model-name", model, "--input", "s3://artifacts/in/", "--output", "s3://artifacts/out/",
                         "--max-payload-mb", "25", "--max-concurrent-transforms", "4", "--content-type", "application/x-npy",
                         "--split-type", "None", "--no-wait")
    assert status == 0, err
    sagemaker = boto("sagemaker")
    [summary] = sagemaker.list_transform_jobs()["TransformJobSummaries"]
    job = sagemaker.describe_transform_job(TransformJobName=summary["TransformJobName"])
    assert (job["MaxPayloadInMB"], job["MaxConcurrentTransforms"], job["TransformInput"]["SplitType"]) == (25, 4, "None")


def test_gpu_transform_warns_about_the_driver(aws_env, cli, model):
    """Batch GPU AMIs have driver 535: the default CUDA 13.0 torch cannot use the GPU there."""
    base = ("transform", "--model-name", model, "--input", "s3://artifacts/in/", "--no-wait")
    status, _, err = cli(*base, "--output", "s3://artifacts/gpu/", "--instance-type", "ml.g5.xlarge")
    assert status == 0, err
    [warning] = [line for line in err.splitlines() if line.startswith("warning:")]
    assert "driver 535" in warning and "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126" in warning
    status, _, err = cli(*base, "--output", "s3://artifacts/cpu/", "--instance-type", "ml.m5.xlarge")
    assert status == 0, err
    assert "warning:" not in err
