"""create-model: the image, the model data, the role and the container's environment.

Models are immutable in SageMaker: running the command again with the same settings
finds the model; with other settings it refuses, naming what to do instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from botocore.exceptions import ClientError

from deploy.aws import Aws, DeployError, describe, error_code, say

# SageMaker takes Docker v2 schema 2 manifests; CreateModel rejects OCI manifests and
# OCI indexes (what `podman build` writes by default, and `docker build` with its
# default provenance attestation).
_OCI_MEDIA_TYPES = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json")
_LAMBDA_ARN = re.compile(r"^arn:aws[a-z-]*:lambda:[a-z0-9-]+:\d{12}:function:[A-Za-z0-9_-]+(:[A-Za-z0-9_$-]+)?$")
_ECR_IMAGE = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/(?P<repo>[^:@]+)(?::(?P<tag>[^@]+))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


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


_S3_URL = re.compile(r"^s3://([^/]+)/(.*)$")
# MetricPublishFrequencyInSeconds' documented values (botocore's model types it only as an integer).
METRIC_INTERVALS = (10, 30, 60, 120, 180, 240, 300)
# MetricsEndpointPath's pattern in botocore's model, anchored.
_METRICS_PATH = re.compile(r"^/(?!.*\.\.)[a-zA-Z0-9/_.\-]{1,255}$")


@dataclass(frozen=True)
class ModelData:
    """Where the model's files are in S3, and how SageMaker puts them in /opt/ml/model.

    Default: one model.tar.gz, unpacked there. uncompressed: every object under an S3
    prefix, copied as it is (nothing to unpack: large models start sooner).
    multi_model: a prefix of <name>.tar.gz archives that SageMaker copies to the
    instance when a request names one (TargetModel), and unloads when short of room.
    """

    url: str | None = None
    multi_model: bool = False
    uncompressed: bool = False

    def check(self) -> None:
        url = self.url
        if self.multi_model and self.uncompressed:
            raise DeployError("--multi-model and --uncompressed exclude each other: a multi-model endpoint loads <name>.tar.gz archives")
        flag = "--multi-model" if self.multi_model else "--uncompressed" if self.uncompressed else None
        if flag and not url:
            raise DeployError(f"{flag} needs --model-data s3://BUCKET/PREFIX/ (the prefix its files are under)")
        if url is None:
            return
        if not _S3_URL.match(url):
            raise DeployError(f"--model-data must be an s3://bucket/key URL, got {url!r}")
        if flag and not url.endswith("/"):
            raise DeployError(f"{flag} takes an S3 prefix ending in /, got {url!r}")
        if not flag and url.endswith("/"):
            raise DeployError(
                f"--model-data {url} is a prefix: add --uncompressed (a model's files as they are) or --multi-model "
                f"(a prefix of <name>.tar.gz archives), or give the model.tar.gz URL"
            )

    def container(self) -> dict:
        """The PrimaryContainer's part that says where the model is."""
        if self.uncompressed:
            return {"ModelDataSource": {"S3DataSource": {"S3Uri": self.url, "S3DataType": "S3Prefix", "CompressionType": "None"}}}
        container = {"ModelDataUrl": self.url} if self.url else {}
        if self.multi_model:
            container["Mode"] = "MultiModel"
        return container


def check_model_data(aws: Aws, data: ModelData) -> None:
    """Refuse model data that is not there; a multi-model prefix may still be empty."""
    bucket, key = _S3_URL.match(data.url).groups()
    s3 = aws.client("s3")
    try:
        if not data.url.endswith("/"):
            s3.head_object(Bucket=bucket, Key=key)
            return
        if s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("KeyCount", 0):
            return
    except ClientError as error:
        if error_code(error) in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
            raise DeployError(f"model data {data.url} does not exist; run `python -m deploy package` first") from None
        say(f"note: could not check {data.url} ({error_code(error)}); SageMaker will")
        return
    if data.multi_model:
        # Models may be added under the prefix at any time; the endpoint loads them on request.
        say(f"note: {data.url} holds no models yet; add <name>.tar.gz archives (package --multi-model) before invoking")
        return
    raise DeployError(f"model data {data.url} holds no files; run `python -m deploy package --uncompressed DIR` first")


def container_metrics(path: str | None, interval: int | None) -> dict | None:
    """ContainerMetricsConfig: where detailed observability scrapes the container.

    None leaves SageMaker's default: /metrics on port 8080 every 60 s, which this
    image serves.
    """
    if path is None and interval is None:
        return None
    path = path or "/metrics"
    if not _METRICS_PATH.match(path):
        raise DeployError(f"--metrics-path must be a path such as /metrics (letters, digits, / _ . -), got {path!r}")
    endpoint = {"MetricsEndpointPath": path}
    if interval is not None:
        check_metrics_interval(interval)
        endpoint["MetricPublishFrequencyInSeconds"] = interval
    return {"MetricsEndpoints": [endpoint]}


def check_metrics_interval(seconds: int) -> None:
    if seconds not in METRIC_INTERVALS:
        raise DeployError(f"--metrics-interval must be one of {', '.join(map(str, METRIC_INTERVALS))} (seconds), got {seconds}")


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
    aws: Aws,
    name: str,
    image: str,
    data: ModelData,
    role_arn: str | None,
    env: dict[str, str],
    source: ImageSource = ImageSource(),
    metrics: dict | None = None,
) -> str:
    source.check(image)  # argument errors first: nothing is asked of AWS, nothing created
    data.check()
    role_arn = check_role(aws, role_arn)
    if source.repository_access == "Vpc":
        # Taken as it is: ECR cannot resolve a digest for another registry, and SageMaker
        # pulls it from inside the VPC, where this machine may not reach.
        say(f"note: image {image} is pulled by SageMaker from your VPC; this tool cannot check it")
    else:
        image = resolve_image(aws, image)
    if data.url:
        check_model_data(aws, data)
    container = {"Image": image, "Environment": env, **data.container()}
    if source.image_config():
        container["ImageConfig"] = source.image_config()
    if metrics:
        container["ContainerMetricsConfig"] = metrics
    request = {"ModelName": name, "ExecutionRoleArn": role_arn, "PrimaryContainer": container}
    if source.vpc_config():
        request["VpcConfig"] = source.vpc_config()
    sagemaker = aws.client("sagemaker")
    existing = describe(sagemaker.describe_model, ModelName=name)
    if existing is not None:
        same = (
            _comparable(existing.get("PrimaryContainer", {})) == _comparable(container)
            and existing.get("ExecutionRoleArn") == role_arn
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


def _comparable(container: dict) -> tuple:
    """What create-model sets in a container, as SageMaker describes it back (defaults filled in)."""
    source = (container.get("ModelDataSource") or {}).get("S3DataSource") or {}
    return (
        container.get("Image"),
        container.get("ModelDataUrl"),
        {key: source.get(key) for key in ("S3Uri", "S3DataType", "CompressionType")} if source else None,
        container.get("Mode") or "SingleModel",
        container.get("Environment") or {},
        container.get("ImageConfig") or None,
        container.get("ContainerMetricsConfig") or None,
    )


def _same_vpc(have: dict | None, want: dict | None) -> bool:
    # SageMaker keeps the IDs as sets: their order is not a difference.
    have, want = have or {}, want or {}
    return all(sorted(have.get(key) or []) == sorted(want.get(key) or []) for key in ("SecurityGroupIds", "Subnets"))

