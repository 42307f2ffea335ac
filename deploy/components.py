"""Inference components: models placed on an endpoint's instances, each with its own
CPU, GPU and memory reservation and its own number of copies.

The endpoint's variant then names no model: it is a pool of instances that SageMaker
grows and shrinks (ManagedInstanceScaling) to fit the copies its components ask for,
down to zero instances when every component has scaled to zero copies.
"""

from __future__ import annotations

from dataclasses import dataclass

from botocore.waiter import WaiterModel, create_waiter_with_client

from deploy.aws import Aws, DeployError, delete, describe, say, wait_until

# botocore ships no waiters for inference components; these follow its endpoint waiters
# (a missing resource is a ValidationException in SageMaker).
_WAITERS = WaiterModel({
    "version": 2,
    "waiters": {
        "InferenceComponentInService": {
            "operation": "DescribeInferenceComponent", "delay": 30, "maxAttempts": 120,
            "acceptors": [
                {"matcher": "path", "argument": "InferenceComponentStatus", "expected": "InService", "state": "success"},
                {"matcher": "path", "argument": "InferenceComponentStatus", "expected": "Failed", "state": "failure"},
                {"matcher": "error", "expected": "ValidationException", "state": "failure"},
            ],
        },
        "InferenceComponentDeleted": {
            "operation": "DescribeInferenceComponent", "delay": 30, "maxAttempts": 120,
            "acceptors": [
                {"matcher": "error", "expected": "ValidationException", "state": "success"},
                {"matcher": "path", "argument": "InferenceComponentStatus", "expected": "Failed", "state": "failure"},
            ],
        },
    },
})


@dataclass(frozen=True)
class Component:
    name: str
    model_name: str
    copies: int
    memory_mb: int  # MinMemoryRequiredInMb: reserved for each copy
    cpus: float | None = None  # NumberOfCpuCoresRequired
    gpus: float | None = None  # NumberOfAcceleratorDevicesRequired
    startup_timeout: int | None = None  # ContainerStartupHealthCheckTimeoutInSeconds
    download_timeout: int | None = None  # ModelDataDownloadTimeoutInSeconds
    variant_name: str = "AllTraffic"

    def check(self) -> None:
        if self.memory_mb < 128:
            raise DeployError(f"--memory-mb must be at least 128 (MB reserved for each copy), got {self.memory_mb}")
        if self.cpus is not None and self.cpus < 0.25:
            raise DeployError(f"--cpus must be at least 0.25, got {self.cpus:g}")
        if self.gpus is not None and self.gpus < 1:
            raise DeployError(f"--gpus must be at least 1 (0 on a GPU instance type: leave the component without a GPU), got {self.gpus:g}")
        for flag, seconds in (("--startup-timeout", self.startup_timeout), ("--download-timeout", self.download_timeout)):
            if seconds is not None and not 60 <= seconds <= 3600:
                raise DeployError(f"{flag} must be 60..3600 seconds, got {seconds}")

    def specification(self) -> dict:
        resources: dict = {"MinMemoryRequiredInMb": self.memory_mb}
        if self.cpus is not None:
            resources["NumberOfCpuCoresRequired"] = float(self.cpus)
        if self.gpus is not None:
            resources["NumberOfAcceleratorDevicesRequired"] = float(self.gpus)
        spec = {"ModelName": self.model_name, "ComputeResourceRequirements": resources}
        startup = {key: value for key, value in (("ModelDataDownloadTimeoutInSeconds", self.download_timeout),
                                                 ("ContainerStartupHealthCheckTimeoutInSeconds", self.startup_timeout)) if value is not None}
        if startup:
            spec["StartupParameters"] = startup
        return spec


def _comparable(spec: dict) -> tuple:
    """A specification as SageMaker describes it back (numbers as floats, absent parts empty)."""
    resources = {key: float(value) for key, value in (spec.get("ComputeResourceRequirements") or {}).items()}
    return spec.get("ModelName"), resources, spec.get("StartupParameters") or {}


def deploy(aws: Aws, endpoint_name: str, component: Component, wait: dict) -> dict:
    """Create the component on the endpoint (or find it as it is) and wait until it serves."""
    sagemaker = aws.client("sagemaker")
    existing = _existing(sagemaker, endpoint_name, component)
    if existing is None:
        say(f"creating inference component {component.name} ({component.copies} copies of model {component.model_name})")
        sagemaker.create_inference_component(
            InferenceComponentName=component.name,
            EndpointName=endpoint_name,
            VariantName=component.variant_name,
            Specification=component.specification(),
            RuntimeConfig={"CopyCount": component.copies},
        )
    elif _comparable(existing.get("Specification") or {}) != _comparable(component.specification()):
        raise DeployError(f"inference component {component.name} exists with another model or resources; use update-endpoint to change it")
    else:
        # Its copy count is not compared: autoscaling may have moved it since.
        say(f"inference component {component.name} exists ({existing['InferenceComponentStatus']})")
    return wait_in_service(aws, component.name, **wait)


def update(aws: Aws, endpoint_name: str, component: Component, wait: dict) -> dict:
    """Give the component a new model or resources (a rolling redeploy), or only a new copy count."""
    sagemaker = aws.client("sagemaker")
    existing = _existing(sagemaker, endpoint_name, component)
    if existing is None:
        raise DeployError(f"inference component {component.name} does not exist; use create-endpoint --inference-component {component.name}")
    if _comparable(existing.get("Specification") or {}) != _comparable(component.specification()):
        say(f"updating inference component {component.name} to model {component.model_name}, {component.copies} copies")
        sagemaker.update_inference_component(
            InferenceComponentName=component.name, Specification=component.specification(), RuntimeConfig={"CopyCount": component.copies}
        )
    elif (existing.get("RuntimeConfig") or {}).get("DesiredCopyCount") != component.copies:
        # Copies alone: no redeploy, SageMaker adds or removes copies of what runs.
        say(f"setting inference component {component.name} to {component.copies} copies")
        sagemaker.update_inference_component_runtime_config(InferenceComponentName=component.name, DesiredRuntimeConfig={"CopyCount": component.copies})
    else:
        say(f"inference component {component.name} already runs these settings")
    return wait_in_service(aws, component.name, **wait)


def _existing(sagemaker, endpoint_name: str, component: Component) -> dict | None:
    existing = describe(sagemaker.describe_inference_component, InferenceComponentName=component.name)
    if existing is not None and existing["EndpointName"] != endpoint_name:
        raise DeployError(f"inference component {component.name} belongs to endpoint {existing['EndpointName']}; component names are unique per account and region")
    if existing is not None and existing["InferenceComponentStatus"] == "Failed":
        reason = " ".join(str(existing.get("FailureReason") or "no FailureReason given").split())
        raise DeployError(f"inference component {component.name} is Failed ({reason}); delete it with teardown, then create it again")
    return existing


def wait_in_service(aws: Aws, name: str, poll_seconds: float = 30, max_wait_seconds: float = 3600) -> dict:
    sagemaker = aws.client("sagemaker")
    waiter = create_waiter_with_client("InferenceComponentInService", _WAITERS, sagemaker)
    return wait_until(sagemaker, waiter, "describe_inference_component", f"inference component {name}", "InferenceComponentStatus",
                      poll_seconds, max_wait_seconds, InferenceComponentName=name)


def on_endpoint(aws: Aws, endpoint_name: str | None = None) -> list[dict]:
    """Summaries of the components on one endpoint, or on every endpoint."""
    paginator = aws.client("sagemaker").get_paginator("list_inference_components")
    found = []
    for page in paginator.paginate(**({"EndpointNameEquals": endpoint_name} if endpoint_name else {})):
        found += page["InferenceComponents"]
    return found


def remove(aws: Aws, name: str, poll_seconds: float, max_wait_seconds: float) -> bool:
    """Delete the component and wait until it is gone; False when it was already gone."""
    sagemaker = aws.client("sagemaker")
    existing = describe(sagemaker.describe_inference_component, InferenceComponentName=name)
    if existing is None:
        return False
    if existing["InferenceComponentStatus"] != "Deleting" and not delete(sagemaker.delete_inference_component, InferenceComponentName=name):
        return False
    waiter = create_waiter_with_client("InferenceComponentDeleted", _WAITERS, sagemaker)
    wait_until(sagemaker, waiter, "describe_inference_component", f"inference component {name}", "InferenceComponentStatus",
               poll_seconds, max_wait_seconds, InferenceComponentName=name)
    return True
