"""create-endpoint, update-endpoint and teardown."""

from __future__ import annotations

import argparse
import dataclasses
import os

from deploy.aws import DeployError
from deploy.commands import non_negative, positive

DEFAULT_INSTANCE_TYPE = "ml.m5.xlarge"


# Instance-only options: unset (None) unless the user gave them, so a serverless
# endpoint can tell "given" from "default".
_INSTANCE_FLAGS = {
    "instance_type": "--instance-type",
    "instance_count": "--instance-count",
    "inference_ami_version": "--inference-ami-version",
    "volume_gb": "--volume-gb",
    "startup_timeout": "--startup-timeout",
    "download_timeout": "--download-timeout",
}


def _variant(aws, args):
    from deploy import endpoint

    if args.serverless_max_concurrency is not None and args.serverless_memory is None:
        raise DeployError("--serverless-max-concurrency needs --serverless-memory")
    if args.serverless_memory is not None:
        given = {flag: getattr(args, name) for name, flag in _INSTANCE_FLAGS.items() if getattr(args, name) is not None}
        if args.autoscale:
            raise DeployError("--autoscale registers instance scaling; serverless endpoints scale themselves up to --serverless-max-concurrency")
        if args.async_output:
            raise DeployError("asynchronous endpoints run on instances; drop --serverless-memory or --async-output")
        variant = endpoint.Variant(
            model_name=args.model_name,
            instance_type=None,
            variant_name=args.variant_name,
            serverless_memory_mb=args.serverless_memory,
            serverless_max_concurrency=args.serverless_max_concurrency or 5,
        )
        return endpoint.serverless_variant(variant, given)
    instance_type = args.instance_type or DEFAULT_INSTANCE_TYPE
    return endpoint.Variant(
        model_name=args.model_name,
        instance_type=instance_type,
        instance_count=args.instance_count or 1,
        variant_name=args.variant_name,
        startup_timeout=600 if args.startup_timeout is None else args.startup_timeout,
        download_timeout=600 if args.download_timeout is None else args.download_timeout,
        ami_version=endpoint.choose_ami(aws, instance_type, args.inference_ami_version),
        volume_gb=args.volume_gb,
    )


def _async_config(args):
    from deploy import endpoint

    extra = {"--async-failure": args.async_failure, "--sns-success": args.sns_success, "--sns-error": args.sns_error,
             "--max-concurrent-invocations-per-instance": args.max_concurrent_invocations_per_instance}
    if not args.async_output:
        for flag, value in extra.items():
            if value is not None:
                raise DeployError(f"{flag} configures an asynchronous endpoint: add --async-output s3://BUCKET/PREFIX")
        return None
    config = endpoint.AsyncConfig(
        output_path=args.async_output,
        failure_path=args.async_failure,
        success_topic=args.sns_success,
        error_topic=args.sns_error,
        max_concurrent_invocations=args.max_concurrent_invocations_per_instance,
    )
    config.check()
    return config


# Options of an inference component, by attribute, as the user spells them.
_COMPONENT_FLAGS = {"copies": "--copies", "memory_mb": "--memory-mb", "cpus": "--cpus", "gpus": "--gpus", "max_copies": "--max-copies", "role": "--role"}


def _component(aws, args):
    """The inference component the command asks for (None without --inference-component), checked."""
    from deploy import components, endpoint

    if not args.inference_component:
        for name, flag in _COMPONENT_FLAGS.items():
            if getattr(args, name) is not None:
                raise DeployError(f"{flag} configures an inference component: add --inference-component NAME")
        return None
    if args.serverless_memory is not None:
        raise DeployError("inference components run on instances; drop --serverless-memory or --inference-component")
    if args.async_output:
        raise DeployError("inference components serve real-time requests; drop --async-output or --inference-component")
    if args.memory_mb is None:
        raise DeployError("--inference-component needs --memory-mb (memory reserved for each copy)")
    if not (args.role or os.environ.get("SAGEMAKER_ROLE_ARN")):
        raise DeployError("an endpoint of inference components needs an execution role: pass --role arn:aws:iam::ACCOUNT:role/NAME or set SAGEMAKER_ROLE_ARN")
    instance_type = args.instance_type or DEFAULT_INSTANCE_TYPE
    gpus = args.gpus
    if gpus is None and endpoint.is_gpu_instance(instance_type):
        gpus = 1  # without a reservation the component's copies get no GPU at all
    if gpus is not None and gpus > 0 and not endpoint.is_gpu_instance(instance_type):
        raise DeployError(f"--gpus reserves accelerators, which {instance_type} has none of; pick an ml.g*/ml.p* --instance-type")
    component = components.Component(
        name=args.inference_component,
        model_name=args.model_name,
        copies=1 if args.copies is None else args.copies,
        memory_mb=args.memory_mb,
        cpus=args.cpus,
        gpus=gpus or None,
        startup_timeout=600 if args.startup_timeout is None else args.startup_timeout,
        download_timeout=600 if args.download_timeout is None else args.download_timeout,
        variant_name=args.variant_name,
    )
    component.check()
    return component


def _endpoint_command(update: bool):
    def command(aws, args, runner):
        from deploy import autoscaling, components, endpoint, model

        # Every argument is checked before anything is created.
        component = _component(aws, args)
        variant = _variant(aws, args)
        async_config = _async_config(args)
        count = variant.instance_count
        min_instances = count if args.min_instances is None else args.min_instances
        max_instances = max(count, 2) if args.max_instances is None else args.max_instances
        if component is None:
            if args.autoscale and min_instances == 0 and async_config is None:
                raise DeployError("--min-instances 0 (scale to zero) is for asynchronous endpoints (--async-output) and inference components; "
                                  "real-time endpoints keep at least one instance")
            if not args.autoscale and (args.min_instances is not None or args.max_instances is not None):
                raise DeployError("--min-instances and --max-instances take effect with --autoscale")
        elif not min_instances <= count <= max_instances:
            raise DeployError(f"an endpoint of inference components needs --min-instances <= --instance-count <= --max-instances, got {min_instances}, {count}, {max_instances}")
        metrics = endpoint.metrics_config(args.detailed_observability, args.metrics_interval)
        role = None
        if component is not None:
            # The variant is a pool of instances sized by SageMaker; the component names the model.
            variant = dataclasses.replace(variant, model_name=None, startup_timeout=None, download_timeout=None,
                                          managed_instances=(min_instances, max_instances), routing="LEAST_OUTSTANDING_REQUESTS")
            role = model.check_role(aws, args.role or os.environ.get("SAGEMAKER_ROLE_ARN"))
            endpoint.check_model_exists(aws, component.model_name)
        config = endpoint.EndpointConfig(variant, async_config=async_config, metrics=metrics, execution_role=role)
        wait = {"poll_seconds": args.poll_seconds, "max_wait_seconds": args.max_wait}
        if update:
            described = endpoint.update_endpoint(aws, args.endpoint_name, config, wait, autoscale_after=args.autoscale)
        else:
            described = endpoint.create_endpoint(aws, args.endpoint_name, config, wait)
        yield f"{described['EndpointName']} {described['EndpointStatus']} {described['EndpointArn']}"
        if component is not None:
            deployed = (components.update if update else components.deploy)(aws, args.endpoint_name, component, wait)
            if args.autoscale or min_instances == 0:
                max_copies = max(component.copies, 2) if args.max_copies is None else args.max_copies
                autoscaling.autoscale_component(aws, component.name, 0 if min_instances == 0 else 1, max_copies, args.target_invocations)
            yield f"{deployed['InferenceComponentName']} {deployed['InferenceComponentStatus']} {deployed['InferenceComponentArn']}"
        elif args.autoscale and async_config is not None:
            autoscaling.autoscale_async(aws, args.endpoint_name, args.variant_name, min_instances, max_instances, args.target_backlog)
        elif args.autoscale:
            autoscaling.autoscale(aws, args.endpoint_name, args.variant_name, min_instances, max_instances, args.target_invocations)

    return command


def cmd_teardown(aws, args, runner):
    from deploy import teardown

    if not args.endpoint_name and not args.model_name:
        raise DeployError("teardown needs --endpoint-name and/or --model-name")
    if args.keep_models and args.model_name:
        raise DeployError("teardown takes --keep-models or --model-name, not both")
    yield from teardown.teardown(
        aws, args.endpoint_name, args.model_name or [], poll_seconds=args.poll_seconds, max_wait_seconds=args.max_wait, keep_models=args.keep_models
    )


def add(sub, common, waiting) -> None:
    from deploy.endpoint import DEFAULT_GPU_AMI

    for name, update in (("create-endpoint", False), ("update-endpoint", True)):
        p = sub.add_parser(
            name,
            parents=[common, waiting],
            help="endpoint config + endpoint, waited until InService" if not update else "switch an endpoint to new settings/model, waited",
        )
        p.add_argument("--endpoint-name", required=True)
        p.add_argument("--model-name", required=True)
        p.add_argument("--instance-type", help=f"default {DEFAULT_INSTANCE_TYPE}")
        p.add_argument("--instance-count", type=positive, help="default 1")
        p.add_argument("--variant-name", default="AllTraffic")
        p.add_argument("--startup-timeout", type=int, help="ContainerStartupHealthCheckTimeoutInSeconds, 60..3600 (default 600)")
        p.add_argument("--download-timeout", type=int, help="ModelDataDownloadTimeoutInSeconds, 60..3600 (default 600)")
        p.add_argument("--volume-gb", type=int, help="VolumeSizeInGB (instance types without local NVMe)")
        p.add_argument(
            "--inference-ami-version",
            help=f"InferenceAmiVersion for ml.g*/ml.p* (default {DEFAULT_GPU_AMI}: NVIDIA driver 580 / CUDA 13.0, as the default image's torch needs)",
        )
        p.add_argument("--autoscale", action="store_true",
                       help="register target-tracking autoscaling (invocations per instance; backlog per instance when async; invocations per copy for an inference component)")
        p.add_argument("--min-instances", type=non_negative,
                       help="autoscaling minimum (default --instance-count; 0 scales an async endpoint or an endpoint of inference components to zero)")
        p.add_argument("--max-instances", type=positive, help="autoscaling maximum (default max(--instance-count, 2))")
        p.add_argument("--target-invocations", type=float, default=100.0, help="invocations per instance (per copy for a component) per minute to hold (default 100)")
        p.add_argument("--target-backlog", type=float, default=5.0, help="async: queued requests per instance to hold (default 5)")
        serverless = p.add_argument_group("serverless (ServerlessConfig instead of instances; CPU only)")
        serverless.add_argument("--serverless-memory", type=int, metavar="MB", help="MemorySizeInMB: 1024, 2048, ... 6144")
        serverless.add_argument("--serverless-max-concurrency", type=positive, metavar="N", help="MaxConcurrency, 1..200 (default 5)")
        asynchronous = p.add_argument_group("asynchronous (AsyncInferenceConfig; call it with invoke-async)")
        asynchronous.add_argument("--async-output", metavar="S3_URI", help="S3OutputPath: where results are written; makes the endpoint asynchronous")
        asynchronous.add_argument("--async-failure", metavar="S3_URI", help="S3FailurePath: where failed requests' errors are written")
        asynchronous.add_argument("--sns-success", metavar="ARN", help="SNS topic told of each result")
        asynchronous.add_argument("--sns-error", metavar="ARN", help="SNS topic told of each failure")
        asynchronous.add_argument("--max-concurrent-invocations-per-instance", type=positive, metavar="N", help="requests SageMaker sends one instance at once")
        component = p.add_argument_group(
            "inference component (the variant names no model; SageMaker sizes its instances, ManagedInstanceScaling, to fit the copies)")
        component.add_argument("--inference-component", metavar="NAME", help="host --model-name as this inference component")
        component.add_argument("--copies", type=positive, metavar="N", help="RuntimeConfig.CopyCount: copies of the model to run (default 1)")
        component.add_argument("--memory-mb", type=int, metavar="MB", help="MinMemoryRequiredInMb reserved for each copy (required with --inference-component)")
        component.add_argument("--cpus", type=float, metavar="C", help="NumberOfCpuCoresRequired for each copy (at least 0.25; default: none reserved)")
        component.add_argument("--gpus", type=float, metavar="G",
                               help="NumberOfAcceleratorDevicesRequired for each copy (default 1 on ml.g*/ml.p*, where 0 reserves none; none elsewhere)")
        component.add_argument("--max-copies", type=positive, metavar="N", help="copy autoscaling maximum (default max(--copies, 2))")
        component.add_argument("--role", metavar="ARN", help="the endpoint's ExecutionRoleArn, which components need (default: SAGEMAKER_ROLE_ARN)")
        observability = p.add_argument_group("observability (MetricsConfig; unset: SageMaker's defaults, detailed observability on for new configs, every 60 s)")
        observability.add_argument("--detailed-observability", action=argparse.BooleanOptionalAction,
                                   help="EnableDetailedObservability: publish the container's Prometheus metrics (its /metrics, or create-model --metrics-path), "
                                   "per-GPU and host metrics to CloudWatch; --no-detailed-observability turns it off")
        observability.add_argument("--metrics-interval", type=int, metavar="SECONDS", help="MetricPublishFrequencyInSeconds: 10, 30, 60, 120, 180, 240 or 300 (default 60)")
        p.set_defaults(handler=_endpoint_command(update))


def add_teardown(sub, common, waiting) -> None:
    p = sub.add_parser("teardown", parents=[common, waiting], help="delete endpoint, its components, configs and models; missing ones are fine")
    p.add_argument("--endpoint-name")
    p.add_argument("--model-name", action="append", help="model to delete (repeatable; default: the endpoint's models)")
    p.add_argument("--keep-models", action="store_true", help="delete the endpoint and its configs only, e.g. to recreate a Failed endpoint")
    p.set_defaults(handler=cmd_teardown)
