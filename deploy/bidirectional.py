"""invoke --bidirectional: InvokeEndpointWithBidirectionalStream.

boto3 has no client for this API: it runs over HTTP/2 with event streams both ways, and
AWS ships it as a separate SDK, `aws-sdk-sagemaker-runtime-http2` (asyncio, Smithy),
which needs Python >= 3.12, with its `awscrt` extra (the default aiohttp transport
cannot stream both ways). The project's environment is Python 3.11, so the package is
not a dependency: with it installed (in a 3.12+ environment), this command uses it;
without, it says how to get it. docs/deploy.md shows the same calls as a script.

What travels: each line of the input file is one payload part (UTF8 for text types,
BINARY otherwise); SageMaker turns each into one WebSocket message to the container's
/invocations-bidirectional-stream, and each message the container sends back arrives
as a payload part, printed as it comes.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
from pathlib import Path
from typing import Iterator

from deploy import codec
from deploy.aws import DeployError

PACKAGE = "aws-sdk-sagemaker-runtime-http2"
VERSION = "0.12.0"  # the release this module was written against
TEXT_TYPES = (codec.JSON, codec.JSONLINES, codec.CSV)


def payload_parts(path: Path, content_type: str | None) -> list[tuple[bytes, str]]:
    """(bytes, DataType) per record: one line of the file each; a binary file is one part."""
    path = Path(path)
    if not path.is_file():
        raise DeployError(f"--input {path} is not a file")
    kind = codec.media_type(content_type or "") or {".json": codec.JSON, ".jsonl": codec.JSONLINES, ".csv": codec.CSV}.get(path.suffix, "")
    data = path.read_bytes()
    if kind in TEXT_TYPES or kind.startswith("text/"):
        parts = [(line, "UTF8") for line in data.splitlines() if line.strip()]
        if not parts:
            raise DeployError(f"--input {path} has no records")
        try:
            for line, _ in parts:
                line.decode("utf-8")
        except UnicodeDecodeError:
            raise DeployError(f"--input {path} is not UTF-8 text; pass --content-type application/octet-stream to send it as binary") from None
        return parts
    return [(data, "BINARY")]


def sdk_missing() -> str | None:
    """Why the SDK cannot be used here, or None when it can."""
    if sys.version_info < (3, 12):
        return (
            f"invoke --bidirectional needs {PACKAGE} (AWS's HTTP/2 client; boto3 has none), which needs Python >= 3.12 "
            f"and this is {sys.version_info.major}.{sys.version_info.minor}: see docs/deploy.md, 'Bidirectional streaming'"
        )
    try:
        import aws_sdk_sagemaker_runtime_http2  # noqa: F401
        import smithy_http.aio.crt  # noqa: F401  (the one transport that streams both ways)
    except ImportError:
        return f"invoke --bidirectional needs {PACKAGE} with its CRT transport: pip install '{PACKAGE}[awscrt]=={VERSION}'"
    return None


def invoke(aws, endpoint_name: str, input_path: str, content_type: str | None) -> Iterator[str]:
    """Send the file's records and yield each answer as it arrives."""
    parts = payload_parts(Path(input_path), content_type)  # argument errors before anything else
    why = sdk_missing()
    if why:
        raise DeployError(why)
    credentials = aws.session.get_credentials().get_frozen_credentials()
    answers: queue.Queue = queue.Queue()
    done = object()

    def run() -> None:
        try:
            asyncio.run(_converse(endpoint_name, parts, aws.region, credentials, aws.endpoint_url, answers.put))
        except BaseException as error:  # handed to the caller's thread, which prints it
            answers.put(error)
        answers.put(done)

    # The SDK is asyncio; the CLI prints from a generator: a thread joins the two.
    threading.Thread(target=run, name="bidirectional-stream", daemon=True).start()
    while (item := answers.get()) is not done:
        if isinstance(item, BaseException):
            raise DeployError(f"bidirectional stream: {' '.join(str(item).split()) or type(item).__name__}") from None
        yield item


async def _converse(endpoint_name, parts, region, credentials, endpoint_url, emit) -> None:
    from aws_sdk_sagemaker_runtime_http2.client import AsyncSageMakerRuntimeHTTP2Client
    from aws_sdk_sagemaker_runtime_http2.config import AsyncSageMakerRuntimeHTTP2Config
    from smithy_http.aio.crt import AWSCRTHTTPClient

    from aws_sdk_sagemaker_runtime_http2.models import (
        InvokeEndpointWithBidirectionalStreamInput,
        RequestPayloadPart,
        RequestStreamEventPayloadPart,
        ResponseStreamEventInternalStreamFailure,
        ResponseStreamEventModelStreamError,
        ResponseStreamEventPayloadPart,
    )

    overrides = {
        "region": region,
        # The boto3 session's credentials, so --profile and the usual chain apply here too.
        "aws_access_key_id": credentials.access_key,
        "aws_secret_access_key": credentials.secret_key,
        "aws_session_token": credentials.token,
        "transport": AWSCRTHTTPClient(),
    }
    if endpoint_url:
        overrides["endpoint_uri"] = endpoint_url
    config = await AsyncSageMakerRuntimeHTTP2Config.resolve(**overrides)
    client = AsyncSageMakerRuntimeHTTP2Client(config=config)
    request = InvokeEndpointWithBidirectionalStreamInput(endpoint_name=endpoint_name)
    async with await client.invoke_endpoint_with_bidirectional_stream(request) as stream:

        async def send() -> None:
            for data, data_type in parts:
                await stream.input_stream.send(RequestStreamEventPayloadPart(value=RequestPayloadPart(bytes_=data, data_type=data_type)))
            await stream.input_stream.close()

        sender = asyncio.create_task(send())
        _, output = await stream.await_output()
        async for event in output:
            if isinstance(event, ResponseStreamEventPayloadPart):
                part = event.value
                if part.data_type == "BINARY":
                    emit(f'{{"bytes": {len(part.bytes_ or b"")}}}')
                else:
                    emit((part.bytes_ or b"").decode("utf-8", "replace"))
            elif isinstance(event, (ResponseStreamEventModelStreamError, ResponseStreamEventInternalStreamFailure)):
                kind = "ModelStreamError" if isinstance(event, ResponseStreamEventModelStreamError) else "InternalStreamFailure"
                code = getattr(event.value, "error_code", None)
                raise RuntimeError(f"{kind}{f' {code}' if code else ''}: {getattr(event.value, 'message', '')}")
        await sender
