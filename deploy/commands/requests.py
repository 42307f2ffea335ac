"""invoke, invoke-async and transform: requests to an endpoint, and batch jobs."""

from __future__ import annotations

from deploy import codec
from deploy.aws import DeployError
from deploy.commands import from_args, positive


_ROUTING_FLAGS = {"CustomAttributes": "--custom-attributes", "InferenceId": "--inference-id", "TargetModel": "--target-model",
                  "InferenceComponentName": "--inference-component", "SessionId": "--session-id"}


def cmd_invoke(aws, args, runner):
    from deploy import invoke, stream

    if args.stream and args.bidirectional:
        raise DeployError("--stream and --bidirectional are different APIs: pick one")
    routing = from_args(invoke.Routing, args)
    if args.bidirectional:
        for flag in routing.params():
            raise DeployError(f"--bidirectional takes no {_ROUTING_FLAGS[flag]} (InvokeEndpointWithBidirectionalStream has no {flag})")
        from deploy import bidirectional

        if not args.input:
            raise DeployError("--bidirectional sends a file's records: pass --input FILE")
        yield from bidirectional.invoke(aws, args.endpoint_name, args.input, args.content_type)
        return
    body, content_type = invoke.request_body(args.input, args.array, args.content_type, args.input_name, args.dtype)
    if args.stream:
        events, response_type = invoke.invoke_stream(aws, args.endpoint_name, body, content_type, args.accept, routing)
        yield from stream.printable(events, response_type)
        return
    response, response_type = invoke.invoke(aws, args.endpoint_name, body, content_type, args.accept, routing)
    yield invoke.render(response, response_type)


def cmd_invoke_async(aws, args, runner):
    from deploy import invoke

    request = from_args(invoke.AsyncRequest, args)
    yield invoke.invoke_async(aws, request, args.wait, args.poll_seconds, args.max_wait)


def cmd_transform(aws, args, runner):
    from deploy import transform

    spec = from_args(transform.TransformSpec, args, input_uri=args.input, output_uri=args.output, ami_version=args.transform_ami_version)
    yield transform.transform(aws, spec, args.job_name, not args.no_wait, args.poll_seconds, args.max_wait)


def add(sub, common, waiting) -> None:
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
    p.add_argument("--custom-attributes", metavar="STR",
                   help="CustomAttributes: up to 1024 ASCII characters the container's hooks see; the answer's own are printed to stderr")
    p.add_argument("--inference-id", help="InferenceId, to find the request in data capture and logs")
    p.add_argument("--target-model", metavar="NAME.tar.gz", help="TargetModel: the model of a multi-model endpoint, its key under the model's prefix")
    p.add_argument("--inference-component", metavar="NAME", help="InferenceComponentName: the component to invoke on an endpoint of inference components")
    p.add_argument("--session-id", metavar="ID",
                   help="SessionId: NEW_SESSION opens a stateful session, an ID continues one; NewSessionId/ClosedSessionId are printed to stderr")
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
    p.add_argument("--max-concurrent-transforms", type=positive, help="default: what the container's /execution-parameters says")
    p.add_argument("--invocations-timeout", type=int, default=600, help="ModelClientConfig.InvocationsTimeoutInSeconds (default 600)")
    p.add_argument(
        "--invocations-max-retries", type=int, default=3, choices=range(0, 4), help="ModelClientConfig.InvocationsMaxRetries (default 3, as SageMaker's own)"
    )
    p.add_argument("--join-source", choices=("Input", "None"), help="DataProcessing.JoinSource: Input puts each input record beside its output")
    p.add_argument("--input-filter", help="DataProcessing.InputFilter (JSONPath)")
    p.add_argument("--output-filter", help="DataProcessing.OutputFilter (JSONPath)")
    p.add_argument("--instance-type", default="ml.m5.xlarge")
    p.add_argument("--instance-count", type=positive, default=1)
    p.add_argument(
        "--transform-ami-version",
        help="TransformAmiVersion for ml.g*/ml.p* (default al2-ami-sagemaker-batch-gpu-535: NVIDIA driver 535, so the image needs a CUDA 12.x torch to use the GPU)",
    )
    p.add_argument("--no-wait", action="store_true", help="start the job and print the output path without waiting")
    p.set_defaults(handler=cmd_transform)
