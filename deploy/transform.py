"""transform: a batch transform job over S3 data with the same image as the endpoint."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass

from deploy.aws import Aws, DeployError, describe, say, wait_until
from deploy.endpoint import is_gpu_instance

# The newest batch AMI the API documents (NVIDIA driver 535, CUDA 12.2); 470 is CUDA 11.
# The default image's torch is PyPI's CUDA 13.0 build, which needs driver >= 580, so on
# this AMI it finds no usable GPU; a CUDA 12.x torch runs through CUDA minor-version
# compatibility. Hence a warning for GPU jobs, not a refusal: the image may be rebuilt so.
DEFAULT_GPU_TRANSFORM_AMI = "al2-ami-sagemaker-batch-gpu-535"
GPU_TRANSFORM_WARNING = (
    "warning: GPU transform AMIs carry NVIDIA driver 535 (CUDA 12.2); to use the GPU the image must be built with a "
    "CUDA 12.x torch, e.g. make build TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 (PyPI's default torch is "
    "the CUDA 13.0 build, which needs driver >= 580, and would run on the CPU)"
)
# SageMaker's limits: MaxPayloadInMB <= 100, and MaxConcurrentTransforms x MaxPayloadInMB
# <= 100. 0 means chunked, unbounded payloads, which this container does not take.
MAX_PAYLOAD_MB = 100

# The container's names for SageMaker's BatchStrategy values (SAGEMAKER_BATCH_STRATEGY).
_STRATEGY_ENV = {"MultiRecord": "MULTI_RECORD", "SingleRecord": "SINGLE_RECORD"}


@dataclass(frozen=True)
class TransformSpec:
    model_name: str
    input_uri: str
    output_uri: str
    content_type: str = "text/csv"
    accept: str | None = None
    split_type: str = "Line"
    batch_strategy: str = "MultiRecord"
    assemble_with: str = "Line"
    max_payload_mb: int = 6
    # None lets SageMaker ask the container (GET /execution-parameters).
    max_concurrent_transforms: int | None = None
    invocations_timeout: int = 600
    # SageMaker's own default, and the local runner's (local_test): a transient failure
    # (a worker restarting, a dropped connection) must not fail a whole job.
    invocations_max_retries: int = 3
    join_source: str | None = None  # "Input" joins each output line to its input record
    input_filter: str | None = None
    output_filter: str | None = None
    instance_type: str = "ml.m5.xlarge"
    instance_count: int = 1
    ami_version: str | None = None  # TransformAmiVersion; GPU instance types only

    def job_name(self) -> str:
        """Job names are single-use in SageMaker; hashing the spec makes a rerun find its job."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        base = re.sub(r"[^a-zA-Z0-9-]", "-", self.model_name)[:52].strip("-")
        return f"{base}-{digest}"

    def request(self, job_name: str) -> dict:
        for uri in (self.input_uri, self.output_uri):
            if not uri.startswith("s3://"):
                raise DeployError(f"transform input and output must be s3:// URIs, got {uri!r}")
        if not 1 <= self.max_payload_mb <= MAX_PAYLOAD_MB:
            raise DeployError(f"--max-payload-mb must be 1..{MAX_PAYLOAD_MB}, got {self.max_payload_mb}")
        if self.max_concurrent_transforms is not None and self.max_concurrent_transforms * self.max_payload_mb > MAX_PAYLOAD_MB:
            raise DeployError(
                f"--max-concurrent-transforms x --max-payload-mb must be at most {MAX_PAYLOAD_MB} MB, "
                f"got {self.max_concurrent_transforms} x {self.max_payload_mb}"
            )
        if self.content_type == "application/x-npy" and self.split_type == "Line":
            # An .npy file is binary: cut at newline bytes, its pieces are not arrays.
            raise DeployError("--content-type application/x-npy cannot be split into lines; pass --split-type None (one array per file)")
        output = {"S3OutputPath": self.output_uri, "AssembleWith": self.assemble_with, "Accept": self.accept or self.content_type}
        request = {
            "TransformJobName": job_name,
            "ModelName": self.model_name,
            "BatchStrategy": self.batch_strategy,
            "MaxPayloadInMB": self.max_payload_mb,
            "ModelClientConfig": {
                "InvocationsTimeoutInSeconds": self.invocations_timeout,
                "InvocationsMaxRetries": self.invocations_max_retries,
            },
            # The container reads its batch limits from these, so they match the job's.
            "Environment": {
                "SAGEMAKER_BATCH": "true",
                "SAGEMAKER_BATCH_STRATEGY": _STRATEGY_ENV[self.batch_strategy],
                "SAGEMAKER_MAX_PAYLOAD_IN_MB": str(self.max_payload_mb),
            },
            "TransformInput": {
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": self.input_uri}},
                "ContentType": self.content_type,
                "SplitType": self.split_type,
            },
            "TransformOutput": output,
            "TransformResources": {"InstanceType": self.instance_type, "InstanceCount": self.instance_count},
        }
        if is_gpu_instance(self.instance_type):
            request["TransformResources"]["TransformAmiVersion"] = self.ami_version or DEFAULT_GPU_TRANSFORM_AMI
        elif self.ami_version:
            raise DeployError(f"--transform-ami-version applies to GPU instance types (ml.g*/ml.p*), not {self.instance_type}")
        if self.max_concurrent_transforms is not None:
            request["MaxConcurrentTransforms"] = self.max_concurrent_transforms
            request["Environment"]["SAGEMAKER_MAX_CONCURRENT_TRANSFORMS"] = str(self.max_concurrent_transforms)
        processing = {
            key: value
            for key, value in (("JoinSource", self.join_source), ("InputFilter", self.input_filter), ("OutputFilter", self.output_filter))
            if value
        }
        if processing:
            request["DataProcessing"] = processing
        return request


def transform(aws: Aws, spec: TransformSpec, job_name: str | None, wait: bool, poll_seconds: float, max_wait_seconds: float) -> str:
    """Start (or find) the job, wait for it, and return its S3 output path."""
    sagemaker = aws.client("sagemaker")
    job_name = job_name or spec.job_name()
    request = spec.request(job_name)  # checks the arguments before anything is created
    if is_gpu_instance(spec.instance_type):
        say(GPU_TRANSFORM_WARNING)
    existing = describe(sagemaker.describe_transform_job, TransformJobName=job_name)
    if existing is None:
        if describe(sagemaker.describe_model, ModelName=spec.model_name) is None:
            raise DeployError(f"model {spec.model_name} does not exist; run create-model first")
        say(f"creating transform job {job_name}")
        sagemaker.create_transform_job(**request)
    else:
        say(f"transform job {job_name} exists ({existing['TransformJobStatus']})")
    output = spec.output_uri
    if wait:
        try:
            final = _wait(sagemaker, job_name, poll_seconds, max_wait_seconds)
        except DeployError as error:
            if "is Failed" in str(error):
                # The default name is derived from the settings, so the same command finds this job again.
                raise DeployError(f"{error} (after fixing it, rerun with a new --job-name)") from None
            raise
        if final["TransformJobStatus"] == "Stopped":
            raise DeployError(f"transform job {job_name} was stopped before it completed")
        output = final["TransformOutput"]["S3OutputPath"]
    return output


def _wait(sagemaker, job_name: str, poll_seconds: float, max_wait_seconds: float) -> dict:
    return wait_until(sagemaker, "transform_job_completed_or_stopped", "describe_transform_job", f"transform job {job_name}", "TransformJobStatus",
                      poll_seconds, max_wait_seconds, TransformJobName=job_name)
