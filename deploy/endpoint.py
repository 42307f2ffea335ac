"""create-endpoint and update-endpoint: endpoint configs, endpoints, and waiting for them.

Each step first looks at what exists, so running a command twice changes nothing the
second time. Endpoint configs are immutable in SageMaker; ours are named after the
endpoint plus a hash of their content, so "same settings" means "same config name".
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from deploy import autoscaling
from deploy.aws import Aws, DeployError, describe, say, wait_until
from deploy.model import check_metrics_interval

# The default image's torch (2.13.0 from PyPI) is the CUDA 13.0 build, which needs
# NVIDIA driver >= 580. This AMI carries driver 580 / CUDA 13.0, so it runs that image,
# and CUDA 12.x builds (TORCH_INDEX_URL=.../cu126 or cu128) as well.
DEFAULT_GPU_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"


def is_gpu_instance(instance_type: str) -> bool:
    """ml.g*/ml.p* carry NVIDIA GPUs (ml.g4dn, ml.g5, ml.g6, ml.p4d, ml.p5 ...)."""
    family = instance_type.removeprefix("ml.").split(".", 1)[0]
    return family[:1] in ("g", "p")


def valid_ami_versions(aws: Aws) -> list[str]:
    """InferenceAmiVersion's allowed values, from the installed botocore's service model."""
    model = aws.session._session.get_service_model("sagemaker")  # the installed API description
    return list(model.shape_for("ProductionVariantInferenceAmiVersion").enum)


@dataclass(frozen=True)
class Variant:
    model_name: str | None  # None: the variant hosts inference components, which name their models
    instance_type: str | None  # None: serverless
    instance_count: int = 1
    variant_name: str = "AllTraffic"
    startup_timeout: int | None = None  # ContainerStartupHealthCheckTimeoutInSeconds
    download_timeout: int | None = None  # ModelDataDownloadTimeoutInSeconds
    ami_version: str | None = None  # InferenceAmiVersion; GPU instance types only
    volume_gb: int | None = None
    serverless_memory_mb: int | None = None  # ServerlessConfig instead of instances
    serverless_max_concurrency: int | None = None
    managed_instances: tuple[int, int] | None = None  # ManagedInstanceScaling (min, max), for inference components
    routing: str | None = None  # RoutingConfig.RoutingStrategy

    @property
    def serverless(self) -> bool:
        return self.serverless_memory_mb is not None

    def production_variant(self) -> dict:
        variant = {"VariantName": self.variant_name}
        if self.model_name:
            variant["ModelName"] = self.model_name
        if self.serverless:
            variant["ServerlessConfig"] = {"MemorySizeInMB": self.serverless_memory_mb, "MaxConcurrency": self.serverless_max_concurrency}
        else:
            variant["InstanceType"] = self.instance_type
            variant["InitialInstanceCount"] = self.instance_count
        if self.startup_timeout is not None:
            variant["ContainerStartupHealthCheckTimeoutInSeconds"] = self.startup_timeout
        if self.download_timeout is not None:
            variant["ModelDataDownloadTimeoutInSeconds"] = self.download_timeout
        if self.volume_gb is not None:
            variant["VolumeSizeInGB"] = self.volume_gb
        if self.ami_version:
            variant["InferenceAmiVersion"] = self.ami_version
        if self.managed_instances:
            low, high = self.managed_instances
            variant["ManagedInstanceScaling"] = {"Status": "ENABLED", "MinInstanceCount": low, "MaxInstanceCount": high}
        if self.routing:
            variant["RoutingConfig"] = {"RoutingStrategy": self.routing}
        return variant


SERVERLESS_MEMORY_MB = (1024, 2048, 3072, 4096, 5120, 6144)


def serverless_variant(variant: Variant, given: dict[str, object]) -> Variant:
    """Check a serverless variant against the instance options the user also gave.

    `given` maps each instance-only flag the user passed to its value. Serverless
    endpoints run on CPU only, without instance types, counts, volumes or AMIs.
    """
    memory, concurrency = variant.serverless_memory_mb, variant.serverless_max_concurrency
    if memory not in SERVERLESS_MEMORY_MB:
        raise DeployError(f"--serverless-memory must be one of {', '.join(map(str, SERVERLESS_MEMORY_MB))} (MB), got {memory}")
    if not 1 <= concurrency <= 200:
        raise DeployError(f"--serverless-max-concurrency must be 1..200, got {concurrency}")
    instance_type = given.get("--instance-type")
    if instance_type and is_gpu_instance(str(instance_type)):
        raise DeployError(f"serverless endpoints have no GPU: drop --instance-type {instance_type}, or drop --serverless-memory to run on {instance_type}")
    if "--inference-ami-version" in given:
        raise DeployError("--inference-ami-version selects a GPU driver, and serverless endpoints have no GPU: drop it or --serverless-memory")
    for flag in given:
        raise DeployError(f"{flag} applies to instance-based endpoints; serverless endpoints size themselves with --serverless-memory and --serverless-max-concurrency")
    return variant


@dataclass(frozen=True)
class AsyncConfig:
    """AsyncInferenceConfig: where results and failures go, and whom to tell."""

    output_path: str
    failure_path: str | None = None
    success_topic: str | None = None
    error_topic: str | None = None
    max_concurrent_invocations: int | None = None  # per instance; None: SageMaker chooses

    def check(self) -> None:
        for flag, uri in (("--async-output", self.output_path), ("--async-failure", self.failure_path)):
            if uri is not None and not re.match(r"^s3://[^/]+(/.*)?$", uri):
                raise DeployError(f"{flag} must be an s3://bucket/prefix URI, got {uri!r}")
        for flag, arn in (("--sns-success", self.success_topic), ("--sns-error", self.error_topic)):
            if arn is not None and not re.match(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_.-]+$", arn):
                raise DeployError(f"{flag} must be an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME), got {arn!r}")
        if self.max_concurrent_invocations is not None and not 1 <= self.max_concurrent_invocations <= 1000:
            raise DeployError(f"--max-concurrent-invocations-per-instance must be 1..1000, got {self.max_concurrent_invocations}")

    def request(self) -> dict:
        output = {"S3OutputPath": self.output_path}
        if self.failure_path:
            output["S3FailurePath"] = self.failure_path
        notification = {key: value for key, value in (("SuccessTopic", self.success_topic), ("ErrorTopic", self.error_topic)) if value}
        if notification:
            output["NotificationConfig"] = notification
        config = {"OutputConfig": output}
        if self.max_concurrent_invocations is not None:
            config["ClientConfig"] = {"MaxConcurrentInvocationsPerInstance": self.max_concurrent_invocations}
        return config


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


def metrics_config(detailed: bool | None, interval: int | None) -> dict | None:
    """MetricsConfig; None keeps SageMaker's defaults (detailed observability on for new configs, 60 s)."""
    if interval is not None:
        check_metrics_interval(interval)
    config = {} if detailed is None else {"EnableDetailedObservability": detailed}
    if interval is not None:
        config["MetricPublishFrequencyInSeconds"] = interval
    return config or None


@dataclass(frozen=True)
class EndpointConfig:
    """An endpoint config's content: the variant, and what applies to the whole endpoint."""

    variant: Variant
    async_config: AsyncConfig | None = None
    metrics: dict | None = None  # MetricsConfig
    execution_role: str | None = None  # ExecutionRoleArn: an endpoint of inference components needs one

    def request(self) -> dict:
        request = {"ProductionVariants": [self.variant.production_variant()]}
        if self.async_config is not None:
            request["AsyncInferenceConfig"] = self.async_config.request()
        if self.metrics:
            request["MetricsConfig"] = self.metrics
        if self.execution_role:
            request["ExecutionRoleArn"] = self.execution_role
        return request

    def name(self, endpoint_name: str) -> str:
        content = self.request()
        if len(content) == 1:  # a variant alone: real-time configs keep the names they always had
            content = content["ProductionVariants"][0]
        digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:10]
        return f"{endpoint_name[:52]}-{digest}"  # 63 characters at most


def ensure_endpoint_config(aws: Aws, endpoint_name: str, config: EndpointConfig) -> str:
    name = config.name(endpoint_name)
    sagemaker = aws.client("sagemaker")
    if describe(sagemaker.describe_endpoint_config, EndpointConfigName=name) is None:
        variant = config.variant
        if variant.model_name:
            check_model_exists(aws, variant.model_name, serverless=variant.serverless)
        say(f"creating endpoint config {name}")
        sagemaker.create_endpoint_config(EndpointConfigName=name, **config.request())
    return name


def check_model_exists(aws: Aws, model_name: str, serverless: bool = False) -> None:
    model = describe(aws.client("sagemaker").describe_model, ModelName=model_name)
    if model is None:
        raise DeployError(f"model {model_name} does not exist; run create-model first")
    if serverless:
        check_serverless_model(model)


def check_serverless_model(model: dict) -> None:
    """Serverless endpoints pull from ECR only and run outside any VPC."""
    name = model["ModelName"]
    if (model.get("PrimaryContainer", {}).get("ImageConfig") or {}).get("RepositoryAccessMode") == "Vpc":
        raise DeployError(f"model {name} pulls from a private registry (--registry vpc), which serverless endpoints cannot use; push the image to ECR and create a model without --registry vpc")
    if (model.get("VpcConfig") or {}).get("Subnets"):
        raise DeployError(f"model {name} runs in a VPC (VpcConfig), which serverless endpoints cannot; use an instance-based endpoint or a model without --subnets")


def create_endpoint(aws: Aws, endpoint_name: str, config: EndpointConfig, wait: dict) -> dict:
    sagemaker = aws.client("sagemaker")
    existing = describe(sagemaker.describe_endpoint, EndpointName=endpoint_name)
    if existing is not None and existing["EndpointStatus"] == "Failed":
        # A Failed endpoint never leaves Failed by itself, and SageMaker cannot create one
        # of the same name while it exists: waiting on it would only repeat its old reason.
        reason = " ".join(str(existing.get("FailureReason") or "no FailureReason given").split())
        raise DeployError(
            f"endpoint {endpoint_name} is Failed ({reason}); delete it with "
            f"`python -m deploy teardown --endpoint-name {endpoint_name} --keep-models`, then run create-endpoint again"
        )
    wanted = ensure_endpoint_config(aws, endpoint_name, config)
    if existing is None:
        say(f"creating endpoint {endpoint_name}")
        sagemaker.create_endpoint(EndpointName=endpoint_name, EndpointConfigName=wanted)
    elif existing["EndpointConfigName"] != wanted:
        raise DeployError(
            f"endpoint {endpoint_name} exists with config {existing['EndpointConfigName']}, not {wanted}; "
            f"use update-endpoint to change it"
        )
    else:
        say(f"endpoint {endpoint_name} exists ({existing['EndpointStatus']})")
    return wait_in_service(aws, endpoint_name, **wait)


def update_endpoint(aws: Aws, endpoint_name: str, config: EndpointConfig, wait: dict, autoscale_after: bool = False) -> dict:
    """Switch the endpoint to `config`, keeping its autoscaling.

    AWS refuses an UpdateEndpoint that changes the instance type of an autoscaled
    variant or removes one; only then is the scaling target deregistered first, and
    afterwards registered again as it was (unless autoscale_after: the caller then
    registers it with new settings). A new model or instance count keeps the target
    (AWS "Update endpoints that use auto scaling").
    """
    sagemaker = aws.client("sagemaker")
    existing = describe(sagemaker.describe_endpoint, EndpointName=endpoint_name)
    if existing is None:
        raise DeployError(f"endpoint {endpoint_name} does not exist; use create-endpoint")
    variant = config.variant
    wanted = ensure_endpoint_config(aws, endpoint_name, config)
    if existing["EndpointConfigName"] == wanted:
        say(f"endpoint {endpoint_name} already uses {wanted}")
        return wait_in_service(aws, endpoint_name, **wait)

    current = describe(sagemaker.describe_endpoint_config, EndpointConfigName=existing["EndpointConfigName"])
    if current is None:  # its config was deleted by hand: assume the worst
        blocking = [v["VariantName"] for v in existing.get("ProductionVariants", [])] or [variant.variant_name]
    else:
        blocking = [
            v["VariantName"]
            for v in current["ProductionVariants"]
            if v["VariantName"] != variant.variant_name or v.get("InstanceType") != variant.instance_type
        ]
    saved = []
    blocking_ids = [autoscaling.variant_target(endpoint_name, name).resource_id for name in blocking]
    for target in autoscaling.scalable_targets(aws, blocking_ids) if blocking else []:
        policies = autoscaling.scaling_policies(aws, autoscaling.Target(target["ResourceId"]))
        autoscaling.deregister(aws, autoscaling.Target(target["ResourceId"]))
        saved.append((target, policies))
        say(f"deregistered autoscaling of {target['ResourceId']} for the update (AWS refuses to change the instance type of an autoscaled variant)")
    succeeded = False
    try:
        say(f"updating endpoint {endpoint_name} to {wanted}")
        sagemaker.update_endpoint(EndpointName=endpoint_name, EndpointConfigName=wanted)
        described = wait_in_service(aws, endpoint_name, **wait)
        succeeded = True
        return described
    finally:
        for target, policies in saved:
            kept = target["ResourceId"] == autoscaling.variant_target(endpoint_name, variant.variant_name).resource_id
            # After a failed update the old variants are still there, scaled as before.
            if not succeeded or (kept and not autoscale_after):
                autoscaling.restore(aws, target, policies)


def wait_in_service(aws: Aws, endpoint_name: str, poll_seconds: float = 30, max_wait_seconds: float = 3600) -> dict:
    return wait_until(aws.client("sagemaker"), "endpoint_in_service", "describe_endpoint", f"endpoint {endpoint_name}", "EndpointStatus",
                      poll_seconds, max_wait_seconds, EndpointName=endpoint_name)

