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


def main(argv: list[str] | None = None, runner=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        aws = Aws(region=args.region, profile=args.profile, endpoint_url=args.endpoint_url)
        for line in args.handler(aws, args, runner):
            print(line, flush=True)
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

    yield push.push(aws, args.image, args.repository, args.tag, args.engine, **({"runner": runner} if runner else {}))


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
    yield endpoint.create_model(aws, args.model_name, args.image, args.model_data, args.role, env)


def _variant(aws, args):
    from deploy import endpoint

    return endpoint.Variant(
        model_name=args.model_name,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        variant_name=args.variant_name,
        startup_timeout=args.startup_timeout,
        download_timeout=args.download_timeout,
        ami_version=endpoint.choose_ami(aws, args.instance_type, args.inference_ami_version),
        volume_gb=args.volume_gb,
    )


def _endpoint_command(update: bool):
    def command(aws, args, runner):
        from deploy import endpoint

        variant = _variant(aws, args)
        wait = {"poll_seconds": args.poll_seconds, "max_wait_seconds": args.max_wait}
        if update:
            described = endpoint.update_endpoint(aws, args.endpoint_name, variant, wait, autoscale_after=args.autoscale)
        else:
            described = endpoint.create_endpoint(aws, args.endpoint_name, variant, wait)
        if args.autoscale:
            endpoint.autoscale(
                aws,
                args.endpoint_name,
                args.variant_name,
                args.min_instances or args.instance_count,
                args.max_instances or max(args.instance_count, 2),
                args.target_invocations,
            )
        yield f"{described['EndpointName']} {described['EndpointStatus']} {described['EndpointArn']}"

    return command


def cmd_invoke(aws, args, runner):
    from deploy import invoke

    body, content_type = invoke.request_body(args.input, args.array, args.content_type, args.input_name, args.dtype)
    response, response_type = invoke.invoke(aws, args.endpoint_name, body, content_type, args.accept)
    yield invoke.render(response, response_type)


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

    p = sub.add_parser("push", parents=[common], help="push a local image to ECR; prints repo@sha256:digest")
    p.add_argument("image", help="local image reference, e.g. sagemaker-pytorch-byoc:latest")
    p.add_argument("--repository", help="ECR repository name (default: the image's name; created if missing)")
    p.add_argument("--tag", help="tag in ECR (default: the image's tag)")
    p.add_argument("--engine", choices=("docker", "podman"), help="container engine (default: docker if it answers, else podman)")
    p.set_defaults(handler=cmd_push)

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
    p.set_defaults(handler=cmd_create_model)

    for name, update in (("create-endpoint", False), ("update-endpoint", True)):
        p = sub.add_parser(
            name,
            parents=[common, waiting],
            help="endpoint config + endpoint, waited until InService" if not update else "switch an endpoint to new settings/model, waited",
        )
        p.add_argument("--endpoint-name", required=True)
        p.add_argument("--model-name", required=True)
        p.add_argument("--instance-type", default="ml.m5.xlarge")
        p.add_argument("--instance-count", type=_positive, default=1)
        p.add_argument("--variant-name", default="AllTraffic")
        p.add_argument("--startup-timeout", type=int, default=600, help="ContainerStartupHealthCheckTimeoutInSeconds, 60..3600 (default 600)")
        p.add_argument("--download-timeout", type=int, default=600, help="ModelDataDownloadTimeoutInSeconds, 60..3600 (default 600)")
        p.add_argument("--volume-gb", type=int, help="VolumeSizeInGB (instance types without local NVMe)")
        p.add_argument(
            "--inference-ami-version",
            help=f"InferenceAmiVersion for ml.g*/ml.p* (default {_default_ami()}: NVIDIA driver 580 / CUDA 13.0, as the default image's torch needs)",
        )
        p.add_argument("--autoscale", action="store_true", help="register target-tracking autoscaling on invocations per instance")
        p.add_argument("--min-instances", type=_positive, help="autoscaling minimum (default --instance-count)")
        p.add_argument("--max-instances", type=_positive, help="autoscaling maximum (default max(--instance-count, 2))")
        p.add_argument("--target-invocations", type=float, default=100.0, help="invocations per instance per minute to hold (default 100)")
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
    p.set_defaults(handler=cmd_invoke)

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
    p.add_argument("--invocations-max-retries", type=int, default=1, choices=range(0, 4), help="ModelClientConfig.InvocationsMaxRetries (default 1)")
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


def _default_ami() -> str:
    from deploy.endpoint import DEFAULT_GPU_AMI

    return DEFAULT_GPU_AMI
