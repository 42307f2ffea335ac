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

from deploy.aws import Aws, DeployError, error_code, is_not_found, one_line, say, wait_with_progress

# The default image's torch (2.13.0 from PyPI) is the CUDA 13.0 build, which needs
# NVIDIA driver >= 580. This AMI carries driver 580 / CUDA 13.0, so it runs that image,
# and CUDA 12.x builds (TORCH_INDEX_URL=.../cu126 or cu128) as well.
DEFAULT_GPU_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
# SageMaker takes Docker v2 schema 2 manifests; CreateModel rejects OCI manifests and
# OCI indexes (what `podman build` writes by default, and `docker build` with its
# default provenance attestation).
_OCI_MEDIA_TYPES = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json")
_LAMBDA_ARN = re.compile(r"^arn:aws[a-z-]*:lambda:[a-z0-9-]+:\d{12}:function:[A-Za-z0-9_-]+(:[A-Za-z0-9_$-]+)?$")
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
    what runs visible and reproducible. (Other registries never get here: see ImageSource.)
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
    check_manifest_type(image, details["imageDetails"][0])
    resolved = f"{image[: found.end('repo')]}@{details['imageDetails'][0]['imageDigest']}"
    if resolved != image:
        say(f"image {image} is {resolved}")
    return resolved


def check_manifest_type(image: str, detail: dict) -> None:
    """Refuse an image SageMaker would refuse, with the way to rebuild it."""
    media_type = detail.get("imageManifestMediaType") or ""
    if media_type in _OCI_MEDIA_TYPES:
        kind = "an OCI image index" if "index" in media_type else "an OCI manifest"
        raise DeployError(
            f"image {image} has {kind} ({media_type}), which SageMaker rejects; rebuild it with "
            f"`podman build --format docker` or `docker build --provenance=false` (make build does) and push again"
        )


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


@dataclass(frozen=True)
class ImageSource:
    """Where SageMaker pulls the image from, and the network the model runs in.

    repository_access "Platform" is ECR; "Vpc" is a private Docker registry that
    SageMaker reaches from the model's VPC (subnets and security groups), logging in
    with what auth_lambda returns if the registry needs a login.
    """

    repository_access: str = "Platform"
    auth_lambda: str | None = None
    subnets: tuple[str, ...] = ()
    security_groups: tuple[str, ...] = ()

    def check(self, image: str) -> None:
        """Refuse what SageMaker would refuse (or silently get wrong) before any call is made."""
        vpc = self.repository_access == "Vpc"
        if bool(self.subnets) != bool(self.security_groups):
            raise DeployError("--subnets and --security-groups go together (they are the model's VpcConfig)")
        if vpc and not self.subnets:
            raise DeployError(
                "--registry vpc needs --subnets and --security-groups: SageMaker pulls a private registry's image from the model's VPC"
            )
        if self.auth_lambda and not vpc:
            raise DeployError("--registry-auth-lambda applies to a private registry: add --registry vpc")
        if self.auth_lambda and not _LAMBDA_ARN.match(self.auth_lambda):
            raise DeployError(f"--registry-auth-lambda must be a Lambda function ARN (arn:aws:lambda:REGION:ACCOUNT:function:NAME), got {self.auth_lambda!r}")
        for value, prefix, flag in [(s, "subnet-", "--subnets") for s in self.subnets] + [(g, "sg-", "--security-groups") for g in self.security_groups]:
            if not value.startswith(prefix):
                raise DeployError(f"{flag} takes {prefix}... IDs, got {value!r}")
        if not vpc and not _ECR_IMAGE.match(image):
            raise DeployError(
                f"image {image} is not in ECR; SageMaker pulls other registries only through your VPC: "
                f"pass --registry vpc with --subnets and --security-groups (and --registry-auth-lambda if it needs a login)"
            )

    def image_config(self) -> dict | None:
        if self.repository_access != "Vpc":
            return None  # Platform is SageMaker's default; leaving it out keeps old models comparable
        config = {"RepositoryAccessMode": "Vpc"}
        if self.auth_lambda:
            config["RepositoryAuthConfig"] = {"RepositoryCredentialsProviderArn": self.auth_lambda}
        return config

    def vpc_config(self) -> dict | None:
        if not self.subnets:
            return None
        return {"SecurityGroupIds": list(self.security_groups), "Subnets": list(self.subnets)}


def create_model(
    aws: Aws, name: str, image: str, model_data: str | None, role_arn: str | None, env: dict[str, str], source: ImageSource = ImageSource()
) -> str:
    source.check(image)  # argument errors first: nothing is asked of AWS, nothing created
    role_arn = check_role(aws, role_arn)
    if source.repository_access == "Vpc":
        # Taken as it is: ECR cannot resolve a digest for another registry, and SageMaker
        # pulls it from inside the VPC, where this machine may not reach.
        say(f"note: image {image} is pulled by SageMaker from your VPC; this tool cannot check it")
    else:
        image = resolve_image(aws, image)
    if model_data:
        check_model_data(aws, model_data)
    container = {"Image": image, "Environment": env}
    if model_data:
        container["ModelDataUrl"] = model_data
    if source.image_config():
        container["ImageConfig"] = source.image_config()
    request = {"ModelName": name, "ExecutionRoleArn": role_arn, "PrimaryContainer": container}
    if source.vpc_config():
        request["VpcConfig"] = source.vpc_config()
    sagemaker = aws.client("sagemaker")
    existing = _describe(sagemaker.describe_model, ModelName=name)
    if existing is not None:
        have = existing.get("PrimaryContainer", {})
        same = (
            have.get("Image") == image
            and have.get("ModelDataUrl") == container.get("ModelDataUrl")
            and (have.get("Environment") or {}) == env
            and existing.get("ExecutionRoleArn") == role_arn
            and (have.get("ImageConfig") or None) == container.get("ImageConfig")
            and _same_vpc(existing.get("VpcConfig"), request.get("VpcConfig"))
        )
        if not same:
            raise DeployError(
                f"model {name} exists with a different image, data, environment, role or network; models are immutable: "
                f"pick a new --model-name (then update-endpoint) or teardown first"
            )
        say(f"model {name} exists with these settings")
        return existing["ModelArn"]
    return sagemaker.create_model(**request)["ModelArn"]


def _same_vpc(have: dict | None, want: dict | None) -> bool:
    # SageMaker keeps the IDs as sets: their order is not a difference.
    have, want = have or {}, want or {}
    return all(sorted(have.get(key) or []) == sorted(want.get(key) or []) for key in ("SecurityGroupIds", "Subnets"))


# ---------------------------------------------------------------- endpoint


@dataclass(frozen=True)
class Variant:
    model_name: str
    instance_type: str | None  # None: serverless
    instance_count: int = 1
    variant_name: str = "AllTraffic"
    startup_timeout: int | None = None  # ContainerStartupHealthCheckTimeoutInSeconds
    download_timeout: int | None = None  # ModelDataDownloadTimeoutInSeconds
    ami_version: str | None = None  # InferenceAmiVersion; GPU instance types only
    volume_gb: int | None = None
    serverless_memory_mb: int | None = None  # ServerlessConfig instead of instances
    serverless_max_concurrency: int | None = None

    @property
    def serverless(self) -> bool:
        return self.serverless_memory_mb is not None

    def production_variant(self) -> dict:
        variant = {"VariantName": self.variant_name, "ModelName": self.model_name}
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


def config_name(endpoint_name: str, variant: Variant, async_config: AsyncConfig | None = None) -> str:
    content = variant.production_variant()
    if async_config is not None:  # real-time configs keep the names they always had
        content = {"ProductionVariants": [content], "AsyncInferenceConfig": async_config.request()}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:10]
    return f"{endpoint_name[:52]}-{digest}"  # 63 characters at most


def ensure_endpoint_config(aws: Aws, endpoint_name: str, variant: Variant, async_config: AsyncConfig | None = None) -> str:
    name = config_name(endpoint_name, variant, async_config)
    sagemaker = aws.client("sagemaker")
    if _describe(sagemaker.describe_endpoint_config, EndpointConfigName=name) is None:
        model = _describe(sagemaker.describe_model, ModelName=variant.model_name)
        if model is None:
            raise DeployError(f"model {variant.model_name} does not exist; run create-model first")
        if variant.serverless:
            check_serverless_model(model)
        say(f"creating endpoint config {name}")
        request = {"EndpointConfigName": name, "ProductionVariants": [variant.production_variant()]}
        if async_config is not None:
            request["AsyncInferenceConfig"] = async_config.request()
        sagemaker.create_endpoint_config(**request)
    return name


def check_serverless_model(model: dict) -> None:
    """Serverless endpoints pull from ECR only and run outside any VPC."""
    name = model["ModelName"]
    if (model.get("PrimaryContainer", {}).get("ImageConfig") or {}).get("RepositoryAccessMode") == "Vpc":
        raise DeployError(f"model {name} pulls from a private registry (--registry vpc), which serverless endpoints cannot use; push the image to ECR and create a model without --registry vpc")
    if (model.get("VpcConfig") or {}).get("Subnets"):
        raise DeployError(f"model {name} runs in a VPC (VpcConfig), which serverless endpoints cannot; use an instance-based endpoint or a model without --subnets")


def create_endpoint(aws: Aws, endpoint_name: str, variant: Variant, wait: dict, async_config: AsyncConfig | None = None) -> dict:
    sagemaker = aws.client("sagemaker")
    existing = _describe(sagemaker.describe_endpoint, EndpointName=endpoint_name)
    if existing is not None and existing["EndpointStatus"] == "Failed":
        # A Failed endpoint never leaves Failed by itself, and SageMaker cannot create one
        # of the same name while it exists: waiting on it would only repeat its old reason.
        reason = " ".join(str(existing.get("FailureReason") or "no FailureReason given").split())
        raise DeployError(
            f"endpoint {endpoint_name} is Failed ({reason}); delete it with "
            f"`python -m deploy teardown --endpoint-name {endpoint_name} --keep-models`, then run create-endpoint again"
        )
    wanted = ensure_endpoint_config(aws, endpoint_name, variant, async_config)
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


def update_endpoint(
    aws: Aws, endpoint_name: str, variant: Variant, wait: dict, autoscale_after: bool = False, async_config: AsyncConfig | None = None
) -> dict:
    """Switch the endpoint to the config for `variant`, keeping its autoscaling.

    AWS refuses an UpdateEndpoint that changes the instance type of an autoscaled
    variant or removes one; only then is the scaling target deregistered first, and
    afterwards registered again as it was (unless autoscale_after: the caller then
    registers it with new settings). A new model or instance count keeps the target
    (AWS "Update endpoints that use auto scaling").
    """
    sagemaker = aws.client("sagemaker")
    existing = _describe(sagemaker.describe_endpoint, EndpointName=endpoint_name)
    if existing is None:
        raise DeployError(f"endpoint {endpoint_name} does not exist; use create-endpoint")
    wanted = ensure_endpoint_config(aws, endpoint_name, variant, async_config)
    if existing["EndpointConfigName"] == wanted:
        say(f"endpoint {endpoint_name} already uses {wanted}")
        return wait_in_service(aws, endpoint_name, **wait)

    current = _describe(sagemaker.describe_endpoint_config, EndpointConfigName=existing["EndpointConfigName"])
    if current is None:  # its config was deleted by hand: assume the worst
        blocking = [v["VariantName"] for v in existing.get("ProductionVariants", [])] or [variant.variant_name]
    else:
        blocking = [
            v["VariantName"]
            for v in current["ProductionVariants"]
            if v["VariantName"] != variant.variant_name or v.get("InstanceType") != variant.instance_type
        ]
    saved = []
    for target in scalable_targets(aws, endpoint_name, blocking) if blocking else []:
        policies = scaling_policies(aws, target["ResourceId"])
        _deregister(aws, target["ResourceId"])
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
            kept = target["ResourceId"] == resource_id(endpoint_name, variant.variant_name)
            # After a failed update the old variants are still there, scaled as before.
            if not succeeded or (kept and not autoscale_after):
                _restore(aws, target, policies)


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


def backlog_alarm_name(endpoint_name: str) -> str:
    return f"{endpoint_name}-has-backlog-without-capacity"


def autoscale_async(
    aws: Aws,
    endpoint_name: str,
    variant_name: str,
    min_capacity: int,
    max_capacity: int,
    backlog_per_instance: float,
    scale_in_cooldown: int = 300,
    scale_out_cooldown: int = 60,
) -> str:
    """Scale an async endpoint on its queue: ApproximateBacklogSizePerInstance.

    With min_capacity 0 the endpoint scales to zero when idle. Target tracking alone
    never scales out from zero (there is no instance to average over), so, as AWS's
    async guide does, a step policy adds one instance when the HasBacklogWithoutCapacity
    alarm fires. Every call overwrites what is there. Returns the target policy's ARN.
    """
    if not 0 <= min_capacity <= max_capacity or max_capacity < 1:
        raise DeployError(f"autoscaling needs 0 <= --min-instances <= --max-instances and --max-instances >= 1, got {min_capacity}..{max_capacity}")
    scaling = aws.client("application-autoscaling")
    target = {"ServiceNamespace": "sagemaker", "ResourceId": resource_id(endpoint_name, variant_name), "ScalableDimension": SCALABLE_DIMENSION}
    scaling.register_scalable_target(**target, MinCapacity=min_capacity, MaxCapacity=max_capacity)
    policy = scaling.put_scaling_policy(
        PolicyName=f"{endpoint_name}-backlog-per-instance",
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": float(backlog_per_instance),
            "CustomizedMetricSpecification": {
                "MetricName": "ApproximateBacklogSizePerInstance",
                "Namespace": "AWS/SageMaker",
                "Dimensions": [{"Name": "EndpointName", "Value": endpoint_name}],
                "Statistic": "Average",
            },
            "ScaleInCooldown": scale_in_cooldown,
            "ScaleOutCooldown": scale_out_cooldown,
        },
        **target,
    )
    if min_capacity == 0:
        step = scaling.put_scaling_policy(
            PolicyName=backlog_alarm_name(endpoint_name),
            PolicyType="StepScaling",
            StepScalingPolicyConfiguration=_FROM_ZERO_STEP,
            **target,
        )
        put_backlog_alarm(aws, endpoint_name, step["PolicyARN"])
    say(
        f"autoscaling {resource_id(endpoint_name, variant_name)}: {min_capacity}..{max_capacity} instances at "
        f"{backlog_per_instance:g} queued requests/instance" + (" (scales to zero when idle)" if min_capacity == 0 else "")
    )
    return policy["PolicyARN"]


_FROM_ZERO_STEP = {
    "AdjustmentType": "ChangeInCapacity",
    "MetricAggregationType": "Average",
    "Cooldown": 300,
    "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}],
}


def put_backlog_alarm(aws: Aws, endpoint_name: str, step_policy_arn: str) -> None:
    """The alarm that wakes a scaled-to-zero async endpoint when requests queue up."""
    aws.client("cloudwatch").put_metric_alarm(
        AlarmName=backlog_alarm_name(endpoint_name),
        AlarmDescription=f"requests wait for {endpoint_name}, which has no instance",
        MetricName="HasBacklogWithoutCapacity",
        Namespace="AWS/SageMaker",
        Dimensions=[{"Name": "EndpointName", "Value": endpoint_name}],
        Statistic="Average",
        Period=60,
        EvaluationPeriods=2,
        DatapointsToAlarm=2,
        Threshold=1.0,
        ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="missing",
        AlarmActions=[step_policy_arn],
    )


def scalable_targets(aws: Aws, endpoint_name: str, variant_names) -> list[dict]:
    """The scaling targets of these variants only.

    Asking by ResourceIds keeps the answer to this endpoint's few targets: an account's
    whole list is paginated (50 a page), and targets past the first page were missed.
    """
    ids = list(dict.fromkeys(resource_id(endpoint_name, name) for name in variant_names))
    paginator = aws.client("application-autoscaling").get_paginator("describe_scalable_targets")
    found = []
    for start in range(0, len(ids), 50):  # ResourceIds takes 50 at most
        for page in paginator.paginate(ServiceNamespace="sagemaker", ResourceIds=ids[start : start + 50], ScalableDimension=SCALABLE_DIMENSION):
            found += page["ScalableTargets"]
    return found


def scaling_policies(aws: Aws, rid: str) -> list[dict]:
    paginator = aws.client("application-autoscaling").get_paginator("describe_scaling_policies")
    found = []
    for page in paginator.paginate(ServiceNamespace="sagemaker", ResourceId=rid, ScalableDimension=SCALABLE_DIMENSION):
        found += page["ScalingPolicies"]
    return found


def _deregister(aws: Aws, rid: str) -> None:
    """Deregistering a target also deletes its scaling policies."""
    aws.client("application-autoscaling").deregister_scalable_target(ServiceNamespace="sagemaker", ResourceId=rid, ScalableDimension=SCALABLE_DIMENSION)


_POLICY_CONFIGS = ("TargetTrackingScalingPolicyConfiguration", "StepScalingPolicyConfiguration", "PredictiveScalingPolicyConfiguration")


def _restore(aws: Aws, target: dict, policies: list[dict]) -> None:
    """Register a deregistered target again with its capacities and policies."""
    scaling = aws.client("application-autoscaling")
    rid = target["ResourceId"]
    key = {"ServiceNamespace": "sagemaker", "ResourceId": rid, "ScalableDimension": SCALABLE_DIMENSION}
    try:
        extra = {"SuspendedState": target["SuspendedState"]} if target.get("SuspendedState") else {}
        scaling.register_scalable_target(**key, MinCapacity=target["MinCapacity"], MaxCapacity=target["MaxCapacity"], **extra)
        for policy in policies:
            config = {name: policy[name] for name in _POLICY_CONFIGS if name in policy}
            arn = scaling.put_scaling_policy(**key, PolicyName=policy["PolicyName"], PolicyType=policy["PolicyType"], **config)["PolicyARN"]
            endpoint_name = rid.split("/")[1]
            if policy["PolicyName"] == backlog_alarm_name(endpoint_name):
                put_backlog_alarm(aws, endpoint_name, arn)  # the alarm must act on the policy as it is now
    except ClientError as error:
        # The endpoint's own outcome matters more than this; say how to finish by hand.
        say(f"note: could not restore autoscaling of {rid} ({one_line(error)}); rerun update-endpoint with --autoscale "
            f"--min-instances {target['MinCapacity']} --max-instances {target['MaxCapacity']}")
        return
    say(f"autoscaling of {rid} restored: {target['MinCapacity']}..{target['MaxCapacity']} instances, {len(policies)} policies")


# ---------------------------------------------------------------- teardown


def teardown(
    aws: Aws,
    endpoint_name: str | None,
    model_names: list[str],
    poll_seconds: float = 15,
    max_wait_seconds: float = 1800,
    keep_models: bool = False,
) -> list[str]:
    """Delete the endpoint, its configs and models; what is already gone is skipped.

    Configs and models that another endpoint uses now are kept: deleting them would
    leave that endpoint unable to scale or update. Returns one line per resource.
    """
    sagemaker = aws.client("sagemaker")
    report = []
    models = list(model_names)
    used_configs, used_models = _used_by_other_endpoints(sagemaker, endpoint_name)
    if endpoint_name:
        existing = _describe(sagemaker.describe_endpoint, EndpointName=endpoint_name)
        configs: dict[str, dict | None] = {}
        if existing is not None:
            configs[existing["EndpointConfigName"]] = None
        # Configs left by earlier updates carry the endpoint's name as their prefix.
        for page in sagemaker.get_paginator("list_endpoint_configs").paginate(NameContains=endpoint_name[:52]):
            for summary in page["EndpointConfigs"]:
                name = summary["EndpointConfigName"]
                if re.fullmatch(re.escape(endpoint_name[:52]) + r"-[0-9a-f]{10}", name):
                    configs.setdefault(name, None)
        for name in list(configs):
            if name in used_configs:
                report.append(f"endpoint config {name}: kept, endpoint {used_configs[name]} uses it")
                del configs[name]
            else:
                configs[name] = _describe(sagemaker.describe_endpoint_config, EndpointConfigName=name)
        variants = [v["VariantName"] for v in (existing or {}).get("ProductionVariants", [])]
        variants += [v["VariantName"] for config in configs.values() if config for v in config["ProductionVariants"]]
        targets = scalable_targets(aws, endpoint_name, variants) if variants else []
        for target in targets:
            _deregister(aws, target["ResourceId"])
        if targets:
            report.append(f"autoscaling of {endpoint_name}: deregistered")
        # Deregistering deletes the policies, not the alarm an async endpoint's scale-from-zero uses.
        cloudwatch = aws.client("cloudwatch")
        if cloudwatch.describe_alarms(AlarmNames=[backlog_alarm_name(endpoint_name)])["MetricAlarms"]:
            cloudwatch.delete_alarms(AlarmNames=[backlog_alarm_name(endpoint_name)])
            report.append(f"alarm {backlog_alarm_name(endpoint_name)}: deleted")
        if existing is None:
            report.append(f"endpoint {endpoint_name}: already gone")
        else:
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
        for name, config in configs.items():
            if config is None:
                report.append(f"endpoint config {name}: already gone")
                continue
            if not model_names and not keep_models:
                models += [v["ModelName"] for v in config["ProductionVariants"] if v["ModelName"] not in models]
            _delete(sagemaker.delete_endpoint_config, EndpointConfigName=name)
            report.append(f"endpoint config {name}: deleted")
    for name in models:
        if name in used_models:
            report.append(f"model {name}: kept, endpoint {used_models[name]} uses it")
            continue
        gone = not _delete(sagemaker.delete_model, ModelName=name)
        report.append(f"model {name}: {'already gone' if gone else 'deleted'}")
    return report


def _used_by_other_endpoints(sagemaker, endpoint_name: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """{config name: endpoint} and {model name: endpoint} for every endpoint but this one."""
    configs: dict[str, str] = {}
    models: dict[str, str] = {}
    for page in sagemaker.get_paginator("list_endpoints").paginate():
        for summary in page["Endpoints"]:
            other = summary["EndpointName"]
            if other == endpoint_name:
                continue
            described = _describe(sagemaker.describe_endpoint, EndpointName=other)
            if described is None:
                continue
            configs.setdefault(described["EndpointConfigName"], other)
            config = _describe(sagemaker.describe_endpoint_config, EndpointConfigName=described["EndpointConfigName"])
            for variant in (config or {}).get("ProductionVariants", []):
                models.setdefault(variant["ModelName"], other)
    return configs, models


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
