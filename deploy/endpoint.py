"""create-model, create-endpoint, update-endpoint, teardown.

Each step first looks at what exists, so running a command twice changes nothing the
second time. Endpoint configs are immutable in SageMaker; ours are named after the
endpoint plus a hash of their content, so "same settings" means "same config name".
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from botocore.exceptions import ClientError

from deploy.aws import Aws, DeployError, error_code, is_not_found, say, wait_with_progress

# The Dockerfile's CUDA 12.8 torch wants NVIDIA driver >= 570 for full support (older
# 12.x drivers run it only through minor-version compatibility, without PTX JIT). This
# AMI carries driver 580 / CUDA 13.0, which runs CUDA 12.x images natively.
DEFAULT_GPU_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
_ECR_IMAGE = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/(?P<repo>[^:@]+)(?::(?P<tag>[^@]+))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


def is_gpu_instance(instance_type: str) -> bool:
    """ml.g*/ml.p* carry NVIDIA GPUs (ml.g4dn, ml.g5, ml.g6, ml.p4d, ml.p5 ...)."""
    family = instance_type.removeprefix("ml.").split(".", 1)[0]
    return family[:1] in ("g", "p")


def valid_ami_versions(aws: Aws) -> list[str]:
    """InferenceAmiVersion's allowed values, from the installed botocore's service model."""
    model = aws.session._session.get_service_model("sagemaker")  # the installed API description
    return list(model.shape_for("ProductionVariantInferenceAmiVersion").enum)


# ---------------------------------------------------------------- model


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DeployError(f"--env takes KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def check_role(aws: Aws, role_arn: str | None) -> str:
    if not role_arn:
        raise DeployError(
            "no execution role: pass --role arn:aws:iam::ACCOUNT:role/NAME or set SAGEMAKER_ROLE_ARN "
            "(a role SageMaker can assume, with AmazonSageMakerFullAccess or ECR+S3 read)"
        )
    if not role_arn.startswith("arn:") or ":role/" not in role_arn:
        raise DeployError(f"--role must be an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME), got {role_arn!r}")
    try:
        aws.client("iam").get_role(RoleName=role_arn.rsplit("/", 1)[-1])
    except ClientError as error:
        if error_code(error) == "NoSuchEntity":
            raise DeployError(f"execution role {role_arn} does not exist") from None
        # Many deployers may pass a role without being allowed to read IAM; SageMaker checks it anyway.
        say(f"note: could not check role {role_arn} ({error_code(error)}); SageMaker will")
    return role_arn


def resolve_image(aws: Aws, image: str) -> str:
    """An ECR image by digest; a tag is resolved to the digest it points at now.

    SageMaker pins whatever it is given at create time, but a digest in the model makes
    what runs visible and reproducible. Non-ECR images are passed through.
    """
    found = _ECR_IMAGE.match(image)
    if not found:
        return image
    repo, tag, digest = found["repo"], found["tag"], found["digest"]
    image_id = {"imageDigest": digest} if digest else {"imageTag": tag or "latest"}
    try:
        details = aws.client("ecr").describe_images(registryId=found["account"], repositoryName=repo, imageIds=[image_id])
    except ClientError as error:
        if error_code(error) in ("ImageNotFoundException", "RepositoryNotFoundException"):
            raise DeployError(f"image {image} not found in ECR; push it first (python -m deploy push)") from None
        if error_code(error) in ("AccessDeniedException", "AccessDenied"):
            say(f"note: could not check image {image} (access denied); SageMaker will")
            return image
        raise
    resolved = f"{image[: found.end('repo')]}@{details['imageDetails'][0]['imageDigest']}"
    if resolved != image:
        say(f"image {image} is {resolved}")
    return resolved


def check_model_data(aws: Aws, url: str) -> None:
    match = re.match(r"^s3://([^/]+)/(.+)$", url)
    if not match:
        raise DeployError(f"--model-data must be an s3://bucket/key URL, got {url!r}")
    try:
        aws.client("s3").head_object(Bucket=match[1], Key=match[2])
    except ClientError as error:
        if error_code(error) in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
            raise DeployError(f"model data {url} does not exist; run `python -m deploy package` first") from None
        say(f"note: could not check {url} ({error_code(error)}); SageMaker will")


def create_model(aws: Aws, name: str, image: str, model_data: str | None, role_arn: str | None, env: dict[str, str]) -> str:
    role_arn = check_role(aws, role_arn)
    image = resolve_image(aws, image)
    if model_data:
        check_model_data(aws, model_data)
    container = {"Image": image, "Environment": env}
    if model_data:
        container["ModelDataUrl"] = model_data
    sagemaker = aws.client("sagemaker")
    existing = _describe(sagemaker.describe_model, ModelName=name)
    if existing is not None:
        have = existing.get("PrimaryContainer", {})
        same = (
            have.get("Image") == image
            and have.get("ModelDataUrl") == container.get("ModelDataUrl")
            and (have.get("Environment") or {}) == env
            and existing.get("ExecutionRoleArn") == role_arn
        )
        if not same:
            raise DeployError(
                f"model {name} exists with a different image, data, environment or role; models are immutable: "
                f"pick a new --model-name (then update-endpoint) or teardown first"
            )
        say(f"model {name} exists with these settings")
        return existing["ModelArn"]
    return sagemaker.create_model(ModelName=name, ExecutionRoleArn=role_arn, PrimaryContainer=container)["ModelArn"]


# ---------------------------------------------------------------- endpoint


@dataclass(frozen=True)
class Variant:
    model_name: str
    instance_type: str
    instance_count: int = 1
    variant_name: str = "AllTraffic"
    startup_timeout: int | None = None  # ContainerStartupHealthCheckTimeoutInSeconds
    download_timeout: int | None = None  # ModelDataDownloadTimeoutInSeconds
    ami_version: str | None = None  # InferenceAmiVersion; GPU instance types only
    volume_gb: int | None = None

    def production_variant(self) -> dict:
        variant = {
            "VariantName": self.variant_name,
            "ModelName": self.model_name,
            "InstanceType": self.instance_type,
            "InitialInstanceCount": self.instance_count,
        }
        if self.startup_timeout is not None:
            variant["ContainerStartupHealthCheckTimeoutInSeconds"] = self.startup_timeout
        if self.download_timeout is not None:
            variant["ModelDataDownloadTimeoutInSeconds"] = self.download_timeout
        if self.volume_gb is not None:
            variant["VolumeSizeInGB"] = self.volume_gb
        if self.ami_version:
            variant["InferenceAmiVersion"] = self.ami_version
        return variant


def choose_ami(aws: Aws, instance_type: str, requested: str | None) -> str | None:
    if not is_gpu_instance(instance_type):
        if requested:
            raise DeployError(f"--inference-ami-version applies to GPU instance types (ml.g*/ml.p*), not {instance_type}")
        return None
    version = requested or DEFAULT_GPU_AMI
    valid = valid_ami_versions(aws)
    if version not in valid:
        raise DeployError(f"InferenceAmiVersion {version!r} is not one of: {', '.join(valid)}")
    return version


def config_name(endpoint_name: str, variant: Variant) -> str:
    digest = hashlib.sha256(json.dumps(variant.production_variant(), sort_keys=True).encode()).hexdigest()[:10]
    return f"{endpoint_name[:52]}-{digest}"  # 63 characters at most


def ensure_endpoint_config(aws: Aws, endpoint_name: str, variant: Variant) -> str:
    name = config_name(endpoint_name, variant)
    sagemaker = aws.client("sagemaker")
    if _describe(sagemaker.describe_endpoint_config, EndpointConfigName=name) is None:
        if _describe(sagemaker.describe_model, ModelName=variant.model_name) is None:
            raise DeployError(f"model {variant.model_name} does not exist; run create-model first")
        say(f"creating endpoint config {name}")
        sagemaker.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[variant.production_variant()])
    return name


def create_endpoint(aws: Aws, endpoint_name: str, variant: Variant, wait: dict) -> dict:
    sagemaker = aws.client("sagemaker")
    wanted = ensure_endpoint_config(aws, endpoint_name, variant)
    existing = _describe(sagemaker.describe_endpoint, EndpointName=endpoint_name)
    if existing is None:
        say(f"creating endpoint {endpoint_name}")
        sagemaker.create_endpoint(EndpointName=endpoint_name, EndpointConfigName=wanted)
    elif existing["EndpointConfigName"] != wanted and existing["EndpointStatus"] != "Failed":
        raise DeployError(
            f"endpoint {endpoint_name} exists with config {existing['EndpointConfigName']}, not {wanted}; "
            f"use update-endpoint to change it"
        )
    else:
        say(f"endpoint {endpoint_name} exists ({existing['EndpointStatus']})")
    return wait_in_service(aws, endpoint_name, **wait)


def update_endpoint(aws: Aws, endpoint_name: str, variant: Variant, wait: dict) -> dict:
    sagemaker = aws.client("sagemaker")
    existing = _describe(sagemaker.describe_endpoint, EndpointName=endpoint_name)
    if existing is None:
        raise DeployError(f"endpoint {endpoint_name} does not exist; use create-endpoint")
    wanted = ensure_endpoint_config(aws, endpoint_name, variant)
    if existing["EndpointConfigName"] == wanted:
        say(f"endpoint {endpoint_name} already uses {wanted}")
    else:
        # SageMaker refuses to change the instance count under a registered scaling
        # target; the target is registered again after the update when --autoscale asks.
        if deregister_autoscaling(aws, endpoint_name, variant.variant_name):
            say("deregistered the autoscaling target for the update")
        say(f"updating endpoint {endpoint_name} to {wanted}")
        sagemaker.update_endpoint(EndpointName=endpoint_name, EndpointConfigName=wanted)
    return wait_in_service(aws, endpoint_name, **wait)


def wait_in_service(aws: Aws, endpoint_name: str, poll_seconds: float = 30, max_wait_seconds: float = 3600) -> dict:
    sagemaker = aws.client("sagemaker")
    return wait_with_progress(
        sagemaker.get_waiter("endpoint_in_service"),
        lambda: sagemaker.describe_endpoint(EndpointName=endpoint_name),
        f"endpoint {endpoint_name}",
        "EndpointStatus",
        poll_seconds,
        max_wait_seconds,
        EndpointName=endpoint_name,
    )


# ---------------------------------------------------------------- autoscaling


def resource_id(endpoint_name: str, variant_name: str) -> str:
    return f"endpoint/{endpoint_name}/variant/{variant_name}"


def autoscale(
    aws: Aws,
    endpoint_name: str,
    variant_name: str,
    min_capacity: int,
    max_capacity: int,
    invocations_per_instance: float,
    scale_in_cooldown: int = 300,
    scale_out_cooldown: int = 60,
) -> str:
    """Register the variant's instance count and a target-tracking policy; returns the policy ARN.

    Both calls overwrite what is there, so repeating them is harmless.
    """
    if not 1 <= min_capacity <= max_capacity:
        raise DeployError(f"autoscaling needs 1 <= --min-instances <= --max-instances, got {min_capacity}..{max_capacity}")
    scaling = aws.client("application-autoscaling")
    target = {"ServiceNamespace": "sagemaker", "ResourceId": resource_id(endpoint_name, variant_name), "ScalableDimension": SCALABLE_DIMENSION}
    scaling.register_scalable_target(**target, MinCapacity=min_capacity, MaxCapacity=max_capacity)
    policy = scaling.put_scaling_policy(
        PolicyName=f"{endpoint_name}-invocations-per-instance",
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            # Invocations per instance per minute, averaged over the variant.
            "TargetValue": float(invocations_per_instance),
            "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
            # Scale out fast, in slowly: a cold instance costs minutes of model loading.
            "ScaleInCooldown": scale_in_cooldown,
            "ScaleOutCooldown": scale_out_cooldown,
        },
        **target,
    )
    say(f"autoscaling {resource_id(endpoint_name, variant_name)}: {min_capacity}..{max_capacity} instances at {invocations_per_instance:g} invocations/instance/minute")
    return policy["PolicyARN"]


def deregister_autoscaling(aws: Aws, endpoint_name: str, variant_name: str | None) -> bool:
    """Remove scaling targets (and so their policies) of the endpoint's variants."""
    scaling = aws.client("application-autoscaling")
    prefix = f"endpoint/{endpoint_name}/variant/"
    found = scaling.describe_scalable_targets(ServiceNamespace="sagemaker", ScalableDimension=SCALABLE_DIMENSION)["ScalableTargets"]
    removed = False
    for target in found:
        rid = target["ResourceId"]
        if rid.startswith(prefix) and (variant_name is None or rid == prefix + variant_name):
            scaling.deregister_scalable_target(ServiceNamespace="sagemaker", ResourceId=rid, ScalableDimension=SCALABLE_DIMENSION)
            removed = True
    return removed


# ---------------------------------------------------------------- teardown


def teardown(aws: Aws, endpoint_name: str | None, model_names: list[str], poll_seconds: float = 15, max_wait_seconds: float = 1800) -> list[str]:
    """Delete the endpoint, its configs and models; what is already gone is skipped.

    Returns one line per resource saying what happened.
    """
    sagemaker = aws.client("sagemaker")
    report = []
    models = list(model_names)
    configs: list[str] = []
    if endpoint_name:
        existing = _describe(sagemaker.describe_endpoint, EndpointName=endpoint_name)
        if deregister_autoscaling(aws, endpoint_name, None):
            report.append(f"autoscaling of {endpoint_name}: deregistered")
        if existing is None:
            report.append(f"endpoint {endpoint_name}: already gone")
        else:
            configs.append(existing["EndpointConfigName"])
            if existing["EndpointStatus"] != "Deleting":
                _delete(sagemaker.delete_endpoint, EndpointName=endpoint_name)
            wait_with_progress(
                sagemaker.get_waiter("endpoint_deleted"),
                lambda: None,
                f"endpoint {endpoint_name}",
                "EndpointStatus",
                poll_seconds,
                max_wait_seconds,
                EndpointName=endpoint_name,
            )
            report.append(f"endpoint {endpoint_name}: deleted")
        # Configs left by earlier updates carry the endpoint's name as their prefix.
        for page in sagemaker.get_paginator("list_endpoint_configs").paginate(NameContains=endpoint_name[:52]):
            for summary in page["EndpointConfigs"]:
                name = summary["EndpointConfigName"]
                if re.fullmatch(re.escape(endpoint_name[:52]) + r"-[0-9a-f]{10}", name) and name not in configs:
                    configs.append(name)
        for name in configs:
            config = _describe(sagemaker.describe_endpoint_config, EndpointConfigName=name)
            if config is None:
                report.append(f"endpoint config {name}: already gone")
                continue
            if not model_names:
                models += [v["ModelName"] for v in config["ProductionVariants"] if v["ModelName"] not in models]
            _delete(sagemaker.delete_endpoint_config, EndpointConfigName=name)
            report.append(f"endpoint config {name}: deleted")
    for name in models:
        gone = not _delete(sagemaker.delete_model, ModelName=name)
        report.append(f"model {name}: {'already gone' if gone else 'deleted'}")
    return report


# ---------------------------------------------------------------- helpers


def _describe(operation, **kwargs) -> dict | None:
    try:
        return operation(**kwargs)
    except ClientError as error:
        if is_not_found(error):
            return None
        raise


def _delete(operation, **kwargs) -> bool:
    """True when something was deleted, False when it was already gone."""
    try:
        operation(**kwargs)
        return True
    except ClientError as error:
        if is_not_found(error):
            return False
        raise
