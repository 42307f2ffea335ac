"""create-endpoint, update-endpoint and teardown."""

from __future__ import annotations

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


def _endpoint_command(update: bool):
    def command(aws, args, runner):
        from deploy import autoscaling, endpoint

        # Every argument is checked before anything is created.
        variant = _variant(aws, args)
        async_config = _async_config(args)
        count = variant.instance_count
        min_instances = count if args.min_instances is None else args.min_instances
        max_instances = max(count, 2) if args.max_instances is None else args.max_instances
        if args.autoscale and min_instances == 0 and async_config is None:
            raise DeployError("--min-instances 0 (scale to zero) is for asynchronous endpoints (--async-output); real-time endpoints keep at least one instance")
        if not args.autoscale and (args.min_instances is not None or args.max_instances is not None):
            raise DeployError("--min-instances and --max-instances take effect with --autoscale")
        wait = {"poll_seconds": args.poll_seconds, "max_wait_seconds": args.max_wait}
        if update:
            described = endpoint.update_endpoint(aws, args.endpoint_name, variant, wait, autoscale_after=args.autoscale, async_config=async_config)
        else:
            described = endpoint.create_endpoint(aws, args.endpoint_name, variant, wait, async_config=async_config)
        if args.autoscale and async_config is not None:
            autoscaling.autoscale_async(aws, args.endpoint_name, args.variant_name, min_instances, max_instances, args.target_backlog)
        elif args.autoscale:
            autoscaling.autoscale(aws, args.endpoint_name, args.variant_name, min_instances, max_instances, args.target_invocations)
        yield f"{described['EndpointName']} {described['EndpointStatus']} {described['EndpointArn']}"

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
        p.add_argument("--autoscale", action="store_true", help="register target-tracking autoscaling (invocations per instance; backlog per instance when async)")
        p.add_argument("--min-instances", type=non_negative, help="autoscaling minimum (default --instance-count; 0 scales an async endpoint to zero)")
        p.add_argument("--max-instances", type=positive, help="autoscaling maximum (default max(--instance-count, 2))")
        p.add_argument("--target-invocations", type=float, default=100.0, help="invocations per instance per minute to hold (default 100)")
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
        p.set_defaults(handler=_endpoint_command(update))


def add_teardown(sub, common, waiting) -> None:
    p = sub.add_parser("teardown", parents=[common, waiting], help="delete endpoint, its configs and models; missing ones are fine")
    p.add_argument("--endpoint-name")
    p.add_argument("--model-name", action="append", help="model to delete (repeatable; default: the endpoint's models)")
    p.add_argument("--keep-models", action="store_true", help="delete the endpoint and its configs only, e.g. to recreate a Failed endpoint")
    p.set_defaults(handler=cmd_teardown)
