"""Inference components for the in-process moto server, which has none (5.2.5).

They behave as SageMaker does, as far as the tool can see: a component is Creating,
Updating or Deleting for a moment and then InService (or gone); it needs an endpoint
whose variant names no model (which moto's CreateEndpointConfig is taught to accept),
and a model that exists; and DeleteEndpoint fails while the endpoint still hosts one. Requests still reach moto's recorder as sent.
"""

from __future__ import annotations

import threading

from tests.deploy.support import ACCOUNT, REGION

MAX_SETTLE_WAITS = 20


class Components:
    def __init__(self, settle_seconds: float = 0.3):
        self.settle_seconds = settle_seconds
        self.by_name: dict[str, dict] = {}
        self.fail_next: str | None = None  # a FailureReason for the next component created
        self.describes = 0  # DescribeInferenceComponent calls so far

    def _later(self, action) -> None:
        """action once settle_seconds have passed and a describe has seen the state it
        ends (one since now): on a loaded host the tool's first look can come later than
        settle_seconds, and SageMaker never skips a state it reports. At most
        MAX_SETTLE_WAITS periods, for a test that never looks."""
        seen, remaining = self.describes, [MAX_SETTLE_WAITS]

        def settle() -> None:
            if self.describes == seen and remaining[0] > 0:
                remaining[0] -= 1
                start()
            else:
                action()

        def start() -> None:
            timer = threading.Timer(self.settle_seconds, settle)
            timer.daemon = True
            timer.start()

        start()

    def install(self, monkeypatch) -> None:
        from moto.core.responses import ActionResult, EmptyResult
        from moto.core.utils import utcnow
        from moto.sagemaker.exceptions import ValidationError
        from moto.sagemaker.responses import SageMakerResponse

        fake = self
        arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:inference-component/"

        def find(name: str) -> dict:
            if name not in fake.by_name:
                raise ValidationError(message=f"Could not find inference component '{arn}{name}'.")
            return fake.by_name[name]

        def create_inference_component(self):
            name, endpoint_name = self._get_param("InferenceComponentName"), self._get_param("EndpointName")
            variant_name, spec = self._get_param("VariantName"), self._get_param("Specification")
            backend = self.sagemaker_backend
            if name in fake.by_name:
                raise ValidationError(message=f"Cannot create already existing inference component '{arn}{name}'.")
            endpoint = backend.endpoints.get(endpoint_name)
            if endpoint is None:
                raise ValidationError(message=f"Could not find endpoint '{endpoint_name}'.")
            variants = {v["VariantName"]: v for v in backend.endpoint_configs[endpoint.endpoint_config_name].production_variants}
            if variant_name not in variants or variants[variant_name].get("ModelName"):
                raise ValidationError(message=f"Variant {variant_name} of endpoint {endpoint_name} must exist and name no model to host inference components.")
            if spec["ModelName"] not in backend._models:
                raise ValidationError(message=f"Could not find model '{spec['ModelName']}'.")
            now = utcnow()
            component = fake.by_name[name] = {
                "InferenceComponentName": name, "InferenceComponentArn": arn + name, "EndpointName": endpoint_name,
                "EndpointArn": endpoint.arn, "VariantName": variant_name, "Specification": spec,
                "RuntimeConfig": {"DesiredCopyCount": self._get_param("RuntimeConfig")["CopyCount"], "CurrentCopyCount": 0},
                "CreationTime": now, "LastModifiedTime": now, "InferenceComponentStatus": "Creating",
            }
            failure, fake.fail_next = fake.fail_next, None
            fake._later(lambda: settle(component, failure))
            return ActionResult({"InferenceComponentArn": component["InferenceComponentArn"]})

        def settle(component: dict, failure: str | None = None) -> None:
            if failure:
                component.update(InferenceComponentStatus="Failed", FailureReason=failure)
            else:
                component["InferenceComponentStatus"] = "InService"
                component["RuntimeConfig"]["CurrentCopyCount"] = component["RuntimeConfig"]["DesiredCopyCount"]

        def describe_inference_component(self):
            component = find(self._get_param("InferenceComponentName"))
            fake.describes += 1
            return ActionResult(component)

        def update_inference_component(self):
            component = find(self._get_param("InferenceComponentName"))
            if self._get_param("Specification"):
                component["Specification"] = self._get_param("Specification")
            if self._get_param("RuntimeConfig"):
                component["RuntimeConfig"]["DesiredCopyCount"] = self._get_param("RuntimeConfig")["CopyCount"]
            component.update(InferenceComponentStatus="Updating", LastModifiedTime=utcnow())
            fake._later(lambda: settle(component))
            return ActionResult({"InferenceComponentArn": component["InferenceComponentArn"]})

        def update_inference_component_runtime_config(self):
            component = find(self._get_param("InferenceComponentName"))
            component["RuntimeConfig"]["DesiredCopyCount"] = self._get_param("DesiredRuntimeConfig")["CopyCount"]
            component.update(InferenceComponentStatus="Updating", LastModifiedTime=utcnow())
            fake._later(lambda: settle(component))
            return ActionResult({"InferenceComponentArn": component["InferenceComponentArn"]})

        def delete_inference_component(self):
            name = self._get_param("InferenceComponentName")
            find(name)["InferenceComponentStatus"] = "Deleting"
            fake._later(lambda: fake.by_name.pop(name, None))
            return EmptyResult()

        def list_inference_components(self):
            endpoint_name = self._get_param("EndpointNameEquals")
            keys = ("InferenceComponentName", "InferenceComponentArn", "EndpointName", "EndpointArn", "VariantName",
                    "InferenceComponentStatus", "CreationTime", "LastModifiedTime")
            found = [{key: c[key] for key in keys} for c in fake.by_name.values() if endpoint_name in (None, c["EndpointName"])]
            return ActionResult({"InferenceComponents": found})

        original_delete_endpoint = SageMakerResponse.delete_endpoint

        def delete_endpoint(self):
            name = self._get_param("EndpointName")
            if any(c["EndpointName"] == name for c in fake.by_name.values()):
                raise ValidationError(message=f"Endpoint {name} still hosts inference components; delete them first.")
            return original_delete_endpoint(self)

        from moto.sagemaker.models import SageMakerModelBackend

        original_validate = SageMakerModelBackend.validate_production_variants

        def validate_production_variants(self, production_variants):
            # A variant that hosts inference components names no model; SageMaker takes it.
            return original_validate(self, [v for v in production_variants if "ModelName" in v])

        monkeypatch.setattr(SageMakerModelBackend, "validate_production_variants", validate_production_variants)
        _scale_copies(monkeypatch)
        for handler in (create_inference_component, describe_inference_component, update_inference_component,
                        update_inference_component_runtime_config, delete_inference_component, list_inference_components, delete_endpoint):
            monkeypatch.setattr(SageMakerResponse, handler.__name__, handler, raising=False)


def _scale_copies(monkeypatch) -> None:
    """moto's Application Auto Scaling predates components' copy count as a scalable dimension."""
    from enum import Enum

    from moto.applicationautoscaling import models, responses

    known = {member.name: member.value for member in models.ScalableDimensionValueSet}
    extended = Enum("ScalableDimensionValueSet", {**known, "SAGEMAKER_INFERENCE_COMPONENT_DESIRED_COPY_COUNT": "sagemaker:inference-component:DesiredCopyCount"})
    monkeypatch.setattr(models, "ScalableDimensionValueSet", extended)
    monkeypatch.setattr(responses, "ScalableDimensionValueSet", extended)
