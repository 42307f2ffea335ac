"""The whole deploy flow, as a user types it, against a moto server.

package -> create-model -> create-endpoint (waited, autoscaled) -> invoke -> transform
-> teardown, each run as `python -m deploy` with only AWS_ENDPOINT_URL pointing at
moto (boto3 honours it natively), each checked by what it printed and by what an
independent boto3 client then finds in moto.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import threading

import pytest

from tests.deploy.support import ACCOUNT, REGION, Moto, run_module

pytestmark = pytest.mark.slow

IMAGE_REPO = "sagemaker-pytorch-byoc"


def ok(result):
    """The command's stdout lines, after checking it succeeded quietly enough."""
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout.strip().splitlines()


def test_package_to_teardown(aws_env, boto, role, model_dir, monkeypatch):
    # An image "pushed" earlier: ECR's own API puts a manifest, as a registry push ends.
    ecr = boto("ecr")
    ecr.create_repository(repositoryName=IMAGE_REPO)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json", "layers": [{"digest": "sha256:" + "1" * 64}]})
    digest = ecr.put_image(repositoryName=IMAGE_REPO, imageManifest=manifest, imageTag="v1")["image"]["imageId"]["imageDigest"]
    image_by_tag = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{IMAGE_REPO}:v1"
    image_by_digest = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{IMAGE_REPO}@{digest}"
    s3 = boto("s3")
    s3.create_bucket(Bucket="artifacts")

    # package: files at the archive root, uploaded under a content hash.
    [model_uri] = ok(run_module("package", str(model_dir), "--bucket", "artifacts", "--prefix", "digits"))
    assert model_uri.startswith("s3://artifacts/digits/") and model_uri.endswith("/model.tar.gz")
    key = model_uri.removeprefix("s3://artifacts/")
    archive = s3.get_object(Bucket="artifacts", Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = sorted(tar.getnames())
        assert tar.extractfile("model.pt2").read() == (model_dir / "model.pt2").read_bytes()
    assert names == ["code/inference.py", "metadata.json", "model.pt2"]
    # Same directory again: same key, nothing uploaded.
    again = run_module("package", str(model_dir), "--bucket", "artifacts", "--prefix", "digits")
    assert ok(again) == [model_uri] and "already holds" in again.stderr

    # create-model: the tag is resolved to the digest SageMaker is given.
    create_model = ("create-model", "--model-name", "digits", "--image", image_by_tag, "--model-data", model_uri,
                    "--role", role, "--batch", "--env", "SMSERVE_MAX_BATCH_DELAY_MS=5")
    [model_arn] = ok(run_module(*create_model))
    described = boto("sagemaker").describe_model(ModelName="digits")
    assert described["ModelArn"] == model_arn
    assert described["ExecutionRoleArn"] == role
    assert described["PrimaryContainer"]["Image"] == image_by_digest
    assert described["PrimaryContainer"]["ModelDataUrl"] == model_uri
    assert described["PrimaryContainer"]["Environment"] == {"SAGEMAKER_BATCH": "true", "SMSERVE_MAX_BATCH_DELAY_MS": "5"}
    assert ok(run_module(*create_model)) == [model_arn]  # idempotent

    # create-endpoint on a GPU type, waited, with autoscaling.
    create_endpoint = ("create-endpoint", "--endpoint-name", "digits-ep", "--model-name", "digits",
                       "--instance-type", "ml.g4dn.xlarge", "--instance-count", "1", "--startup-timeout", "900",
                       "--download-timeout", "300", "--autoscale", "--min-instances", "1", "--max-instances", "4",
                       "--target-invocations", "250", "--poll-seconds", "0.2")
    # moto creates endpoints InService at once; SageMaker takes minutes. The endpoint
    # starts Creating here and turns InService a moment later, so the wait has to poll.
    backend = Moto.sagemaker_backend()
    original = backend.create_endpoint

    def create_slowly(**kwargs):
        endpoint = original(**kwargs)
        endpoint.endpoint_status = "Creating"
        threading.Timer(1.0, lambda: setattr(endpoint, "endpoint_status", "InService")).start()
        return endpoint

    monkeypatch.setattr(backend, "create_endpoint", create_slowly)
    result = run_module(*create_endpoint)
    monkeypatch.setattr(backend, "create_endpoint", original)
    [line] = ok(result)
    name, status, arn = line.split()
    assert (name, status) == ("digits-ep", "InService") and arn.endswith(":endpoint/digits-ep")
    # The waiter's progress: the status it saw while polling, with the time so far.
    assert re.search(r"^endpoint digits-ep: Creating \(\d+s\)$", result.stderr, re.MULTILINE), result.stderr
    sagemaker = boto("sagemaker")
    endpoint = sagemaker.describe_endpoint(EndpointName="digits-ep")
    config = sagemaker.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    [variant] = config["ProductionVariants"]
    assert variant == {
        "VariantName": "AllTraffic",
        "ModelName": "digits",
        "InstanceType": "ml.g4dn.xlarge",
        "InitialInstanceCount": 1,
        "ContainerStartupHealthCheckTimeoutInSeconds": 900,
        "ModelDataDownloadTimeoutInSeconds": 300,
        "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
    }
    scaling = boto("application-autoscaling")
    [target] = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["ResourceId"], target["ScalableDimension"], target["MinCapacity"], target["MaxCapacity"]) == (
        "endpoint/digits-ep/variant/AllTraffic", "sagemaker:variant:DesiredInstanceCount", 1, 4)
    [policy] = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert policy["PolicyType"] == "TargetTrackingScaling"
    assert tracking["TargetValue"] == 250.0
    assert tracking["PredefinedMetricSpecification"] == {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}
    # Running it again finds everything in place: same config, still one policy.
    assert ok(run_module(*create_endpoint)) == [line]
    assert len(sagemaker.list_endpoint_configs()["EndpointConfigs"]) == 1
    assert len(scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]) == 1

    # invoke: CSV out, CSV back (scripted in moto), printed as the endpoint said it.
    aws_env.script_invocations({"Body": "0.1,0.9\n0.8,0.2\n", "ContentType": "text/csv", "InvokedProductionVariant": "AllTraffic", "CustomAttributes": ""})
    aws_env.start_recording()
    printed = ok(run_module("invoke", "--endpoint-name", "digits-ep", "--array", "[[0, 16], [3.5, 7]]", "--content-type", "text/csv", "--accept", "text/csv"))
    assert printed == ["0.1,0.9", "0.8,0.2"]
    [sent] = [r for r in aws_env.recorded() if r["url"].endswith("/endpoints/digits-ep/invocations")]
    assert sent["headers"]["Content-Type"] == "text/csv"
    assert sent["headers"]["Accept"] == "text/csv"
    assert sent["raw"] == b"0.0,16.0\n3.5,7.0\n"

    # transform: every batch knob reaches the job; the output path is printed.
    s3.put_object(Bucket="artifacts", Key="batch/in/records.csv", Body=b"0,1\n2,3\n")
    transform = ("transform", "--model-name", "digits", "--input", "s3://artifacts/batch/in/", "--output", "s3://artifacts/batch/out/",
                 "--content-type", "text/csv", "--split-type", "Line", "--batch-strategy", "MultiRecord", "--assemble-with", "Line",
                 "--max-payload-mb", "4", "--max-concurrent-transforms", "2", "--invocations-timeout", "120",
                 "--invocations-max-retries", "2", "--join-source", "Input", "--instance-type", "ml.m5.large", "--poll-seconds", "0.2")
    assert ok(run_module(*transform)) == ["s3://artifacts/batch/out/"]
    [summary] = sagemaker.list_transform_jobs()["TransformJobSummaries"]
    job = sagemaker.describe_transform_job(TransformJobName=summary["TransformJobName"])
    assert job["ModelName"] == "digits"
    assert job["BatchStrategy"] == "MultiRecord"
    assert job["MaxPayloadInMB"] == 4
    assert job["MaxConcurrentTransforms"] == 2
    assert job["ModelClientConfig"] == {"InvocationsTimeoutInSeconds": 120, "InvocationsMaxRetries": 2}
    assert job["DataProcessing"] == {"JoinSource": "Input"}
    assert job["TransformInput"]["SplitType"] == "Line"
    assert job["TransformInput"]["ContentType"] == "text/csv"
    assert job["TransformInput"]["DataSource"]["S3DataSource"] == {"S3DataType": "S3Prefix", "S3Uri": "s3://artifacts/batch/in/"}
    assert job["TransformOutput"] == {"S3OutputPath": "s3://artifacts/batch/out/", "AssembleWith": "Line", "Accept": "text/csv"}
    assert job["TransformResources"] == {"InstanceType": "ml.m5.large", "InstanceCount": 1}
    assert job["Environment"] == {
        "SAGEMAKER_BATCH": "true",
        "SAGEMAKER_BATCH_STRATEGY": "MULTI_RECORD",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "4",
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "2",
    }
    # The same command again finds that job instead of starting another.
    assert ok(run_module(*transform)) == ["s3://artifacts/batch/out/"]
    assert len(sagemaker.list_transform_jobs()["TransformJobSummaries"]) == 1

    # teardown: everything goes, autoscaling first; a second run finds nothing to do.
    lines = ok(run_module("teardown", "--endpoint-name", "digits-ep", "--poll-seconds", "0.2"))
    assert lines == [
        "autoscaling of digits-ep: deregistered",
        "endpoint digits-ep: deleted",
        f"endpoint config {endpoint['EndpointConfigName']}: deleted",
        "model digits: deleted",
    ]
    assert sagemaker.list_endpoints()["Endpoints"] == []
    assert sagemaker.list_endpoint_configs()["EndpointConfigs"] == []
    assert sagemaker.list_models()["Models"] == []
    assert scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert ok(run_module("teardown", "--endpoint-name", "digits-ep", "--model-name", "digits")) == [
        "endpoint digits-ep: already gone",
        "model digits: already gone",
    ]
