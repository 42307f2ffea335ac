"""teardown: an endpoint, its configs, models, autoscaling and alarms; what is gone is skipped."""

from __future__ import annotations

import re

from deploy import autoscaling, components
from deploy.aws import Aws, delete, describe, wait_until


def teardown(
    aws: Aws,
    endpoint_name: str | None,
    model_names: list[str],
    poll_seconds: float = 15,
    max_wait_seconds: float = 1800,
    keep_models: bool = False,
) -> list[str]:
    """Delete the endpoint's inference components, the endpoint, its configs and models;
    what is already gone is skipped.

    Configs and models that another endpoint uses now are kept: deleting them would
    leave that endpoint unable to scale or update. Returns one line per resource.
    """
    sagemaker = aws.client("sagemaker")
    report: list[str] = []
    models = list(model_names)
    used_configs, used_models = _used_by_other_endpoints(aws, endpoint_name)
    if endpoint_name:
        # SageMaker refuses to delete an endpoint that still hosts components.
        for name in _remove_components(aws, endpoint_name, poll_seconds, max_wait_seconds, report):
            if not model_names and not keep_models and name not in models:
                models.append(name)
        existing = describe(sagemaker.describe_endpoint, EndpointName=endpoint_name)
        configs = _endpoint_configs(sagemaker, endpoint_name, existing, used_configs, report)
        variants = [v["VariantName"] for v in (existing or {}).get("ProductionVariants", [])]
        variants += [v["VariantName"] for config in configs.values() if config for v in config["ProductionVariants"]]
        _remove_scaling(aws, endpoint_name, variants, report)
        if existing is None:
            report.append(f"endpoint {endpoint_name}: already gone")
        else:
            if existing["EndpointStatus"] != "Deleting":
                delete(sagemaker.delete_endpoint, EndpointName=endpoint_name)
            wait_until(sagemaker, "endpoint_deleted", "describe_endpoint", f"endpoint {endpoint_name}", "EndpointStatus",
                       poll_seconds, max_wait_seconds, EndpointName=endpoint_name)
            report.append(f"endpoint {endpoint_name}: deleted")
        for name, config in configs.items():
            if config is None:
                report.append(f"endpoint config {name}: already gone")
                continue
            if not model_names and not keep_models:
                models += [v["ModelName"] for v in config["ProductionVariants"] if v.get("ModelName") and v["ModelName"] not in models]
            delete(sagemaker.delete_endpoint_config, EndpointConfigName=name)
            report.append(f"endpoint config {name}: deleted")
    for name in models:
        if name in used_models:
            report.append(f"model {name}: kept, endpoint {used_models[name]} uses it")
            continue
        gone = not delete(sagemaker.delete_model, ModelName=name)
        report.append(f"model {name}: {'already gone' if gone else 'deleted'}")
    return report


def _endpoint_configs(sagemaker, endpoint_name: str, existing: dict | None, used_configs: dict[str, str], report: list[str]) -> dict[str, dict | None]:
    """{name: description or None if gone} of the endpoint's configs that no other endpoint uses."""
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
            configs[name] = describe(sagemaker.describe_endpoint_config, EndpointConfigName=name)
    return configs


def _remove_components(aws: Aws, endpoint_name: str, poll_seconds: float, max_wait_seconds: float, report: list[str]) -> list[str]:
    """Delete each component with its copy scaling and wake alarm; returns their models' names."""
    models = []
    for summary in components.on_endpoint(aws, endpoint_name):
        name = summary["InferenceComponentName"]
        described = describe(aws.client("sagemaker").describe_inference_component, InferenceComponentName=name)
        model = ((described or {}).get("Specification") or {}).get("ModelName")
        target = autoscaling.component_target(name)
        if autoscaling.scalable_targets(aws, [target.resource_id], target.dimension):
            autoscaling.deregister(aws, target)
            report.append(f"autoscaling of inference component {name}: deregistered")
        _delete_alarm(aws, autoscaling.no_capacity_alarm_name(name), report)
        gone = not components.remove(aws, name, poll_seconds, max_wait_seconds)
        report.append(f"inference component {name}: {'already gone' if gone else 'deleted'}")
        if model:
            models.append(model)
    return models


def _remove_scaling(aws: Aws, endpoint_name: str, variants: list[str], report: list[str]) -> None:
    ids = [autoscaling.variant_target(endpoint_name, name).resource_id for name in variants]
    targets = autoscaling.scalable_targets(aws, ids) if ids else []
    for target in targets:
        autoscaling.deregister(aws, autoscaling.Target(target["ResourceId"]))
    if targets:
        report.append(f"autoscaling of {endpoint_name}: deregistered")
    # Deregistering deletes the policies, not the alarm an async endpoint's scale-from-zero uses.
    _delete_alarm(aws, autoscaling.backlog_alarm_name(endpoint_name), report)


def _delete_alarm(aws: Aws, name: str, report: list[str]) -> None:
    cloudwatch = aws.client("cloudwatch")
    if cloudwatch.describe_alarms(AlarmNames=[name])["MetricAlarms"]:
        cloudwatch.delete_alarms(AlarmNames=[name])
        report.append(f"alarm {name}: deleted")


def _used_by_other_endpoints(aws: Aws, endpoint_name: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """{config name: endpoint} and {model name: endpoint} for every endpoint but this one,
    its variants' models and its inference components' models."""
    sagemaker = aws.client("sagemaker")
    configs: dict[str, str] = {}
    models: dict[str, str] = {}
    for page in sagemaker.get_paginator("list_endpoints").paginate():
        for summary in page["Endpoints"]:
            other = summary["EndpointName"]
            if other == endpoint_name:
                continue
            described = describe(sagemaker.describe_endpoint, EndpointName=other)
            if described is None:
                continue
            configs.setdefault(described["EndpointConfigName"], other)
            config = describe(sagemaker.describe_endpoint_config, EndpointConfigName=described["EndpointConfigName"])
            for variant in (config or {}).get("ProductionVariants", []):
                if variant.get("ModelName"):
                    models.setdefault(variant["ModelName"], other)
    for summary in components.on_endpoint(aws):
        if summary["EndpointName"] != endpoint_name:
            described = describe(sagemaker.describe_inference_component, InferenceComponentName=summary["InferenceComponentName"])
            model = ((described or {}).get("Specification") or {}).get("ModelName")
            if model:
                models.setdefault(model, summary["EndpointName"])
    return configs, models

