"""python -m deploy <command>: from a local image to a SageMaker endpoint and batch jobs.

Results (URIs, response bodies) go to stdout; progress and notes to stderr. Every
failure is one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from deploy import codec
from deploy.aws import EXPECTED_ERRORS, Aws, DeployError, one_line
from deploy.stream import Fragment


def main(argv: list[str] | None = None, runner=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        # A push to a private registry needs no AWS account at all.
        needs_aws = args.needs_aws(args) if hasattr(args, "needs_aws") else True
        aws = Aws(region=args.region, profile=args.profile, endpoint_url=args.endpoint_url) if needs_aws else None
        for line in args.handler(aws, args, runner):
            # A Fragment is part of a line (a streamed text part), printed as it came.
            print(line, end="" if isinstance(line, Fragment) else "\n", flush=True)
        return 0
    except EXPECTED_ERRORS as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


# ---------------------------------------------------------------- commands


def cmd_push(aws, args, runner):
    from deploy import push

    engine_runner = {"runner": runner} if runner else {}
    if args.registry:
        if args.repository:
            raise DeployError("--repository names an ECR repository; with --registry the repository is part of HOST[:PORT]/REPO")
        password = push.registry_password(args.username, args.password_stdin, args.password_env)
        uri = push.push_to_registry(args.image, args.registry, args.tag, args.engine, args.username, password, args.insecure, **engine_runner)
    else:
        if args.username or args.password_stdin or args.insecure:
            raise DeployError("--username, --password-stdin and --insecure are for --registry; ECR logs in with your AWS credentials")
        uri = push.push(aws, args.image, args.repository, args.tag, args.engine, **engine_runner)
    if args.output:
        push.write_atomically(args.output, uri + "\n")
    yield uri


def cmd_package(aws, args, runner):
    from deploy import package

    yield package.package(aws, args.model_dir, args.bucket, args.prefix, args.create_bucket)


def cmd_create_model(aws, args, runner):
    from deploy import endpoint

    env = {}
    if args.batch:
        env["SAGEMAKER_BATCH"] = "true"
    if args.workers is not None:
        env["SAGEMAKER_MODEL_SERVER_WORKERS"] = str(args.workers)
    if args.server_timeout is not None:
        env["SAGEMAKER_MODEL_SERVER_TIMEOUT"] = str(args.server_timeout)
    if args.default_accept:
        env["SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT"] = args.default_accept
    env.update(endpoint.parse_env(args.env))  # explicit --env wins over the shorthands
    source = endpoint.ImageSource(
        repository_access="Vpc" if args.registry == "vpc" else "Platform",
        auth_lambda=args.registry_auth_lambda,
        subnets=tuple(_items(args.subnets)),
        security_groups=tuple(_items(args.security_groups)),
    )
    yield endpoint.create_model(aws, args.model_name, args.image, args.model_data, args.role, env, source)


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
        from deploy import endpoint

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
            endpoint.autoscale_async(aws, args.endpoint_name, args.variant_name, min_instances, max_instances, args.target_backlog)
        elif args.autoscale:
            endpoint.autoscale(aws, args.endpoint_name, args.variant_name, min_instances, max_instances, args.target_invocations)
        yield f"{described['EndpointName']} {described['EndpointStatus']} {described['EndpointArn']}"

    return command


def cmd_invoke(aws, args, runner):
    from deploy import invoke, stream

    if args.stream and args.bidirectional:
        raise DeployError("--stream and --bidirectional are different APIs: pick one")
    if args.bidirectional:
        from deploy import bidirectional

        if not args.input:
            raise DeployError("--bidirectional sends a file's records: pass --input FILE")
        yield from bidirectional.invoke(aws, args.endpoint_name, args.input, args.content_type)
        return
    body, content_type = invoke.request_body(args.input, args.array, args.content_type, args.input_name, args.dtype)
    if args.stream:
        events, response_type = invoke.invoke_stream(aws, args.endpoint_name, body, content_type, args.accept)
        yield from stream.printable(events, response_type)
        return
    response, response_type = invoke.invoke(aws, args.endpoint_name, body, content_type, args.accept)
    yield invoke.render(response, response_type)


def cmd_invoke_async(aws, args, runner):
    from deploy import invoke

    request = invoke.AsyncRequest(
        endpoint_name=args.endpoint_name,
        input=args.input,
        content_type=args.content_type,
        accept=args.accept,
        bucket=args.bucket,
        prefix=args.prefix,
        create_bucket=args.create_bucket,
        invocation_timeout=args.invocation_timeout,
        request_ttl=args.request_ttl,
        inference_id=args.inference_id,
    )
    yield invoke.invoke_async(aws, request, args.wait, args.poll_seconds, args.max_wait)


def cmd_transform(aws, args, runner):
    from deploy import transform

    spec = transform.TransformSpec(
        model_name=args.model_name,
        input_uri=args.input,
        output_uri=args.output,
        content_type=args.content_type,
        accept=args.accept,
        split_type=args.split_type,
        batch_strategy=args.batch_strategy,
        assemble_with=args.assemble_with,
        max_payload_mb=args.max_payload_mb,
        max_concurrent_transforms=args.max_concurrent_transforms,
        invocations_timeout=args.invocations_timeout,
        invocations_max_retries=args.invocations_max_retries,
        join_source=args.join_source,
        input_filter=args.input_filter,
        output_filter=args.output_filter,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        ami_version=args.transform_ami_version,
    )
    yield transform.transform(aws, spec, args.job_name, not args.no_wait, args.poll_seconds, args.max_wait)


def cmd_teardown(aws, args, runner):
    from deploy import endpoint

    if not args.endpoint_name and not args.model_name:
        raise DeployError("teardown needs --endpoint-name and/or --model-name")
    if args.keep_models and args.model_name:
        raise DeployError("teardown takes --keep-models or --model-name, not both")
    yield from endpoint.teardown(
        aws, args.endpoint_name, args.model_name or [], poll_seconds=args.poll_seconds, max_wait_seconds=args.max_wait, keep_models=args.keep_models
    )


# ---------------------------------------------------------------- arguments


def _items(values: list[str] | None) -> list[str]:
    """Repeatable, comma-separated options as one list: --subnets a,b --subnets c -> [a, b, c]."""
    return [item.strip() for value in values or [] for item in value.split(",") if item.strip()]


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--region", help="AWS region (default: AWS_REGION / AWS_DEFAULT_REGION / the profile's)")
    common.add_argument("--profile", help="AWS profile (default: AWS_PROFILE)")
    common.add_argument(
        "--endpoint-url",
        help="send every AWS call here (a moto server, LocalStack); default: AWS_ENDPOINT_URL, which boto3 honours itself",
    )

    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--poll-seconds", type=float, default=30.0, help="seconds between status checks (default 30)")
    waiting.add_argument("--max-wait", type=float, default=3600.0, help="give up waiting after this many seconds (default 3600)")

    parser = argparse.ArgumentParser(prog="python -m deploy", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("push", parents=[common], help="push a local image to ECR or a private registry; prints repo@sha256:digest")
    p.add_argument("image", help="local image reference, e.g. sagemaker-pytorch-byoc:latest")
    p.add_argument("--repository", help="ECR repository name (default: the image's name; created if missing)")
    p.add_argument("--tag", help="tag to push (default: the image's tag)")
    p.add_argument("--engine", choices=("docker", "podman"), help="container engine (default: docker if it answers, else podman)")
    p.add_argument(
        "--registry",
        metavar="HOST[:PORT]/REPO",
        help="push to this Docker Registry HTTP API v2 registry instead of ECR (then create-model --registry vpc); needs no AWS credentials",
    )
    p.add_argument("--username", help="log the engine in to --registry as this user (default: the engine's stored login)")
    p.add_argument("--password-stdin", action="store_true", help="read the --registry password from stdin")
    p.add_argument(
        "--password-env",
        default="REGISTRY_PASSWORD",
        metavar="VAR",
        help="environment variable holding the --registry password (default REGISTRY_PASSWORD); never pass a password as an argument",
    )
    p.add_argument("--insecure", action="store_true", help="the registry speaks plain HTTP or has an untrusted certificate (podman only; tests and labs)")
    p.add_argument("--output", metavar="FILE", help="also write the URI to FILE, only once the push succeeded (make push uses build/image-uri)")
    p.set_defaults(handler=cmd_push, needs_aws=lambda args: not args.registry)

    p = sub.add_parser("package", parents=[common], help="model directory -> model.tar.gz in S3; prints the s3:// URI")
    p.add_argument("model_dir", help="directory whose files SageMaker should find in /opt/ml/model")
    p.add_argument("--bucket", help="S3 bucket (default: sagemaker-REGION-ACCOUNT, as the SageMaker SDK uses)")
    p.add_argument("--prefix", default="models", help="key prefix (default: models)")
    p.add_argument("--create-bucket", action="store_true", help="create the bucket if it is missing")
    p.set_defaults(handler=cmd_package)

    p = sub.add_parser("create-model", parents=[common], help="a SageMaker model: image + model data + role + environment")
    p.add_argument("--model-name", required=True)
    p.add_argument("--image", required=True, help="image URI; an ECR tag is resolved to its digest")
    p.add_argument("--model-data", help="s3:// URI of model.tar.gz (from `package`)")
    p.add_argument("--role", default=os.environ.get("SAGEMAKER_ROLE_ARN") or None, help="execution role ARN (default: SAGEMAKER_ROLE_ARN)")
    p.add_argument("--batch", action="store_true", help="SAGEMAKER_BATCH=true: batch-transform limits (transform sets this itself)")
    p.add_argument("--workers", type=_positive, help="SAGEMAKER_MODEL_SERVER_WORKERS")
    p.add_argument("--server-timeout", type=_positive, help="SAGEMAKER_MODEL_SERVER_TIMEOUT (seconds)")
    p.add_argument("--default-accept", choices=codec.SIMPLE_TYPES, help="SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="container environment (repeatable)")
    p.add_argument(
        "--registry",
        choices=("ecr", "vpc"),
        default="ecr",
        help="ecr (default): the image is in ECR; vpc: a private Docker registry SageMaker reaches from the model's VPC "
        "(ImageConfig.RepositoryAccessMode=Vpc; needs --subnets and --security-groups)",
    )
    p.add_argument("--registry-auth-lambda", metavar="ARN", help="Lambda function that returns the private registry's credentials (RepositoryAuthConfig)")
    p.add_argument("--subnets", action="append", metavar="SUBNET[,SUBNET]", help="the model's VpcConfig subnets (repeatable or comma-separated)")
    p.add_argument("--security-groups", action="append", metavar="SG[,SG]", help="the model's VpcConfig security groups (repeatable or comma-separated)")
    p.set_defaults(handler=cmd_create_model)

    for name, update in (("create-endpoint", False), ("update-endpoint", True)):
        p = sub.add_parser(
            name,
            parents=[common, waiting],
            help="endpoint config + endpoint, waited until InService" if not update else "switch an endpoint to new settings/model, waited",
        )
        p.add_argument("--endpoint-name", required=True)
        p.add_argument("--model-name", required=True)
        p.add_argument("--instance-type", help=f"default {DEFAULT_INSTANCE_TYPE}")
        p.add_argument("--instance-count", type=_positive, help="default 1")
        p.add_argument("--variant-name", default="AllTraffic")
        p.add_argument("--startup-timeout", type=int, help="ContainerStartupHealthCheckTimeoutInSeconds, 60..3600 (default 600)")
        p.add_argument("--download-timeout", type=int, help="ModelDataDownloadTimeoutInSeconds, 60..3600 (default 600)")
        p.add_argument("--volume-gb", type=int, help="VolumeSizeInGB (instance types without local NVMe)")
        p.add_argument(
            "--inference-ami-version",
            help=f"InferenceAmiVersion for ml.g*/ml.p* (default {_default_ami()}: NVIDIA driver 580 / CUDA 13.0, as the default image's torch needs)",
        )
        p.add_argument("--autoscale", action="store_true", help="register target-tracking autoscaling (invocations per instance; backlog per instance when async)")
        p.add_argument("--min-instances", type=_non_negative, help="autoscaling minimum (default --instance-count; 0 scales an async endpoint to zero)")
        p.add_argument("--max-instances", type=_positive, help="autoscaling maximum (default max(--instance-count, 2))")
        p.add_argument("--target-invocations", type=float, default=100.0, help="invocations per instance per minute to hold (default 100)")
        p.add_argument("--target-backlog", type=float, default=5.0, help="async: queued requests per instance to hold (default 5)")
        serverless = p.add_argument_group("serverless (ServerlessConfig instead of instances; CPU only)")
        serverless.add_argument("--serverless-memory", type=int, metavar="MB", help="MemorySizeInMB: 1024, 2048, ... 6144")
        serverless.add_argument("--serverless-max-concurrency", type=_positive, metavar="N", help="MaxConcurrency, 1..200 (default 5)")
        asynchronous = p.add_argument_group("asynchronous (AsyncInferenceConfig; call it with invoke-async)")
        asynchronous.add_argument("--async-output", metavar="S3_URI", help="S3OutputPath: where results are written; makes the endpoint asynchronous")
        asynchronous.add_argument("--async-failure", metavar="S3_URI", help="S3FailurePath: where failed requests' errors are written")
        asynchronous.add_argument("--sns-success", metavar="ARN", help="SNS topic told of each result")
        asynchronous.add_argument("--sns-error", metavar="ARN", help="SNS topic told of each failure")
        asynchronous.add_argument("--max-concurrent-invocations-per-instance", type=_positive, metavar="N", help="requests SageMaker sends one instance at once")
        p.set_defaults(handler=_endpoint_command(update))

    p = sub.add_parser("invoke", parents=[common], help="one request to an endpoint; prints the decoded response")
    p.add_argument("--endpoint-name", required=True)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="a file sent as it is (.json/.csv/.jsonl/.npy set the content type)")
    source.add_argument("--array", help="an array (a .npy/.json/.csv file or a JSON literal) encoded as --content-type")
    p.add_argument("--content-type", help=f"one of {', '.join(codec.CONTENT_TYPES)} (default application/json for --array)")
    p.add_argument("--accept", help="response type for simple requests")
    p.add_argument("--input-name", help="the model's input name, for the v2 binary content type")
    p.add_argument("--dtype", default="float32", help="numpy dtype of --array (default float32)")
    p.add_argument(
        "--stream",
        action="store_true",
        help="InvokeEndpointWithResponseStream: print the answer as it arrives (a line per JSON Lines record or Server-Sent Event)",
    )
    p.add_argument(
        "--bidirectional",
        action="store_true",
        help="InvokeEndpointWithBidirectionalStream: send --input's lines as payload parts, print answers as they arrive "
        "(needs aws-sdk-sagemaker-runtime-http2, Python >= 3.12)",
    )
    p.set_defaults(handler=cmd_invoke)

    p = sub.add_parser("invoke-async", parents=[common], help="one request to an asynchronous endpoint; prints the output's s3:// URI, or with --wait the result")
    p.add_argument("--endpoint-name", required=True)
    p.add_argument("--input", required=True, help="a file (uploaded to S3 first) or an s3:// URI of the request body")
    p.add_argument("--content-type", help="the body's type (default: from the file's suffix, .json/.csv/.jsonl/.npy)")
    p.add_argument("--accept", help="response type for simple requests")
    p.add_argument("--bucket", help="bucket for an uploaded --input (default: sagemaker-REGION-ACCOUNT)")
    p.add_argument("--prefix", default="async-inputs", help="key prefix for an uploaded --input (default: async-inputs)")
    p.add_argument("--create-bucket", action="store_true", help="create the bucket if it is missing")
    p.add_argument("--invocation-timeout", type=int, help="InvocationTimeoutSeconds: how long the container may take, 1..3600 (SageMaker's default 900)")
    p.add_argument("--request-ttl", type=int, help="RequestTTLSeconds: how long the request may wait in the queue, 60..21600")
    p.add_argument("--inference-id", help="InferenceId, to find the request in logs and notifications")
    p.add_argument("--wait", action="store_true", help="poll until the result or the failure appears in S3, then print it decoded")
    p.add_argument("--poll-seconds", type=float, default=5.0, help="seconds between looks at S3 (default 5)")
    p.add_argument("--max-wait", type=float, default=3600.0, help="give up waiting after this many seconds (default 3600)")
    p.set_defaults(handler=cmd_invoke_async)

    p = sub.add_parser("transform", parents=[common, waiting], help="a batch transform job, waited; prints the S3 output path")
    p.add_argument("--model-name", required=True)
    p.add_argument("--input", required=True, help="s3:// prefix or object of the input records")
    p.add_argument("--output", required=True, help="s3:// prefix for the .out files")
    p.add_argument("--job-name", help="default: derived from the settings, so a rerun finds the same job")
    p.add_argument("--content-type", default="text/csv", choices=codec.SIMPLE_TYPES)
    p.add_argument("--accept", choices=codec.SIMPLE_TYPES, help="output type (default: the content type)")
    p.add_argument("--split-type", default="Line", choices=("None", "Line", "RecordIO", "TFRecord"))
    p.add_argument("--batch-strategy", default="MultiRecord", choices=("MultiRecord", "SingleRecord"))
    p.add_argument("--assemble-with", default="Line", choices=("None", "Line"))
    p.add_argument("--max-payload-mb", type=int, default=6, help="MaxPayloadInMB, 1..100; times --max-concurrent-transforms at most 100 (default 6)")
    p.add_argument("--max-concurrent-transforms", type=_positive, help="default: what the container's /execution-parameters says")
    p.add_argument("--invocations-timeout", type=int, default=600, help="ModelClientConfig.InvocationsTimeoutInSeconds (default 600)")
    p.add_argument(
        "--invocations-max-retries", type=int, default=3, choices=range(0, 4), help="ModelClientConfig.InvocationsMaxRetries (default 3, as SageMaker's own)"
    )
    p.add_argument("--join-source", choices=("Input", "None"), help="DataProcessing.JoinSource: Input puts each input record beside its output")
    p.add_argument("--input-filter", help="DataProcessing.InputFilter (JSONPath)")
    p.add_argument("--output-filter", help="DataProcessing.OutputFilter (JSONPath)")
    p.add_argument("--instance-type", default="ml.m5.xlarge")
    p.add_argument("--instance-count", type=_positive, default=1)
    p.add_argument(
        "--transform-ami-version",
        help="TransformAmiVersion for ml.g*/ml.p* (default al2-ami-sagemaker-batch-gpu-535: NVIDIA driver 535, so the image needs a CUDA 12.x torch to use the GPU)",
    )
    p.add_argument("--no-wait", action="store_true", help="start the job and print the output path without waiting")
    p.set_defaults(handler=cmd_transform)

    p = sub.add_parser("teardown", parents=[common, waiting], help="delete endpoint, its configs and models; missing ones are fine")
    p.add_argument("--endpoint-name")
    p.add_argument("--model-name", action="append", help="model to delete (repeatable; default: the endpoint's models)")
    p.add_argument("--keep-models", action="store_true", help="delete the endpoint and its configs only, e.g. to recreate a Failed endpoint")
    p.set_defaults(handler=cmd_teardown)
    return parser


DEFAULT_INSTANCE_TYPE = "ml.m5.xlarge"


def _default_ami() -> str:
    from deploy.endpoint import DEFAULT_GPU_AMI

    return DEFAULT_GPU_AMI
