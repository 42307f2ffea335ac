"""push, package and create-model: what an endpoint or a job is made from."""

from __future__ import annotations

import os

from deploy import codec
from deploy.aws import DeployError
from deploy.commands import items, positive


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

    if args.multi_model and args.uncompressed:
        raise DeployError("--multi-model and --uncompressed exclude each other: a multi-model endpoint loads <name>.tar.gz archives")
    if len(args.model_dir) > 1 and not args.multi_model:
        raise DeployError("package takes one model directory; several go under one prefix with --multi-model")
    if args.multi_model:
        yield package.package_multi_model(aws, args.model_dir, args.bucket, args.prefix or "multi-model", args.create_bucket)
    elif args.uncompressed:
        yield package.package_uncompressed(aws, args.model_dir[0], args.bucket, args.prefix or "models", args.create_bucket)
    else:
        yield package.package(aws, args.model_dir[0], args.bucket, args.prefix or "models", args.create_bucket)


def cmd_create_model(aws, args, runner):
    from deploy import model

    env = {}
    if args.batch:
        env["SAGEMAKER_BATCH"] = "true"
    if args.workers is not None:
        env["SAGEMAKER_MODEL_SERVER_WORKERS"] = str(args.workers)
    if args.server_timeout is not None:
        env["SAGEMAKER_MODEL_SERVER_TIMEOUT"] = str(args.server_timeout)
    if args.default_accept:
        env["SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT"] = args.default_accept
    if args.multi_model:
        # The image serves one model or many; this is what switches on its /models API.
        env["SAGEMAKER_MULTI_MODEL"] = "true"
    env.update(model.parse_env(args.env))  # explicit --env wins over the shorthands
    source = model.ImageSource(
        repository_access="Vpc" if args.registry == "vpc" else "Platform",
        auth_lambda=args.registry_auth_lambda,
        subnets=tuple(items(args.subnets)),
        security_groups=tuple(items(args.security_groups)),
    )
    data = model.ModelData(url=args.model_data, multi_model=args.multi_model, uncompressed=args.uncompressed)
    metrics = model.container_metrics(args.metrics_path, args.metrics_interval)
    yield model.create_model(aws, args.model_name, args.image, data, args.role, env, source, metrics)


def add(sub, common, waiting) -> None:
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
    p.add_argument("model_dir", nargs="+", help="directory whose files SageMaker should find in /opt/ml/model (several with --multi-model)")
    p.add_argument("--bucket", help="S3 bucket (default: sagemaker-REGION-ACCOUNT, as the SageMaker SDK uses)")
    p.add_argument("--prefix", help="key prefix (default: models; multi-model for --multi-model)")
    p.add_argument("--multi-model", action="store_true",
                   help="each directory as <its name>.tar.gz under PREFIX/, for create-model --multi-model; prints the prefix")
    p.add_argument("--uncompressed", action="store_true",
                   help="the directory's files as they are under PREFIX/<hash>/, for create-model --uncompressed; prints the prefix")
    p.add_argument("--create-bucket", action="store_true", help="create the bucket if it is missing")
    p.set_defaults(handler=cmd_package)

    p = sub.add_parser("create-model", parents=[common], help="a SageMaker model: image + model data + role + environment")
    p.add_argument("--model-name", required=True)
    p.add_argument("--image", required=True, help="image URI; an ECR tag is resolved to its digest")
    p.add_argument("--model-data", help="s3:// URI of model.tar.gz (from `package`), or with --multi-model / --uncompressed an s3://BUCKET/PREFIX/")
    p.add_argument("--multi-model", action="store_true",
                   help="Mode MultiModel: --model-data is a prefix of <name>.tar.gz archives, picked per request by invoke --target-model; "
                   "sets SAGEMAKER_MULTI_MODEL=true")
    p.add_argument("--uncompressed", action="store_true",
                   help="ModelDataSource S3Prefix, CompressionType None: --model-data's files are copied to /opt/ml/model as they are (nothing to unpack)")
    p.add_argument("--metrics-path", metavar="PATH",
                   help="ContainerMetricsConfig: where detailed observability scrapes Prometheus metrics (SageMaker's default /metrics on 8080, which this image serves)")
    p.add_argument("--metrics-interval", type=int, metavar="SECONDS",
                   help="the container metrics' MetricPublishFrequencyInSeconds: 10, 30, 60, 120, 180, 240 or 300 (SageMaker's default 60)")
    p.add_argument("--role", default=os.environ.get("SAGEMAKER_ROLE_ARN") or None, help="execution role ARN (default: SAGEMAKER_ROLE_ARN)")
    p.add_argument("--batch", action="store_true", help="SAGEMAKER_BATCH=true: batch-transform limits (transform sets this itself)")
    p.add_argument("--workers", type=positive, help="SAGEMAKER_MODEL_SERVER_WORKERS")
    p.add_argument("--server-timeout", type=positive, help="SAGEMAKER_MODEL_SERVER_TIMEOUT (seconds)")
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
