"""One boto3 session for a command, and the turning of AWS failures into one line."""

from __future__ import annotations

import os
import sys
import time

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    WaiterError,
)


class DeployError(Exception):
    """A failure the user can act on; str() is the one line printed."""


def say(message: str) -> None:
    """Progress and notes go to stderr, so stdout holds only the result (an URI, a body)."""
    print(message, file=sys.stderr, flush=True)


class Aws:
    """The session, region and endpoint every client of one command shares.

    endpoint_url=None lets botocore resolve the endpoint itself, which honours
    AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE> (botocore >= 1.31).
    """

    def __init__(self, region: str | None = None, profile: str | None = None, endpoint_url: str | None = None):
        # botocore reads AWS_DEFAULT_REGION only; the AWS CLI and SDKs for other languages
        # also read AWS_REGION, which SageMaker notebooks and CodeBuild set.
        region = region or os.environ.get("AWS_REGION") or None
        try:
            self.session = boto3.Session(profile_name=profile, region_name=region)
        except BotoCoreError as error:  # e.g. ProfileNotFound
            raise DeployError(one_line(error)) from None
        if not self.session.region_name:
            raise DeployError("no AWS region: pass --region or set AWS_REGION (or AWS_DEFAULT_REGION)")
        if self.session.get_credentials() is None:
            raise DeployError(
                "no AWS credentials: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "or run `aws configure` / `aws sso login`"
            )
        self.region = self.session.region_name
        self.endpoint_url = endpoint_url
        self._clients: dict[str, object] = {}
        self._account: str | None = None

    def client(self, service: str):
        if service not in self._clients:
            self._clients[service] = self.session.client(
                service,
                endpoint_url=self.endpoint_url,
                # Standard retries absorb throttling on the describe loops.
                config=Config(retries={"mode": "standard", "max_attempts": 3}),
            )
        return self._clients[service]

    @property
    def account(self) -> str:
        if self._account is None:
            self._account = self.client("sts").get_caller_identity()["Account"]
        return self._account


def error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def is_not_found(error: ClientError) -> bool:
    """SageMaker reports a missing resource as ValidationException 'Could not find ...'."""
    code = error_code(error)
    message = error.response.get("Error", {}).get("Message", "")
    return code in ("ResourceNotFound", "NoSuchEntity", "404", "NoSuchKey", "NoSuchBucket") or (
        code == "ValidationException" and ("Could not find" in message or "does not exist" in message)
    )


def one_line(error: BaseException) -> str:
    """The message of an AWS/botocore failure, on one line, without the traceback."""
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        operation = getattr(error, "operation_name", "request")
        message = " ".join(str(info.get("Message") or "").split())
        if "<html" in message.lower() or "<!doctype" in message.lower():
            message = "the service answered with an HTML error page"
        return f"{operation} failed: {info.get('Code', 'error')}: {message}".rstrip(": ")
    if isinstance(error, NoCredentialsError):
        return "no AWS credentials: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    if isinstance(error, NoRegionError):
        return "no AWS region: pass --region or set AWS_REGION (or AWS_DEFAULT_REGION)"
    if isinstance(error, EndpointConnectionError):
        return f"cannot reach the AWS endpoint: {error}"
    text = " ".join(str(error).split())
    return text or type(error).__name__


# Everything the CLI turns into one line and a non-zero exit.
EXPECTED_ERRORS = (DeployError, ClientError, BotoCoreError, ParamValidationError, WaiterError)


def wait_with_progress(waiter, describe, label: str, status_key: str, poll_seconds: float, max_wait_seconds: float, **kwargs):
    """Run a boto3 waiter one attempt at a time, printing the status between attempts.

    The waiter's own acceptors decide success and failure (so the states are AWS's, not
    ours); single attempts let us print where it stands. Returns the last description.
    Raises DeployError with the resource's FailureReason when the waiter fails.
    """
    started = time.monotonic()
    last_status = None
    while True:
        try:
            waiter.wait(WaiterConfig={"Delay": 0, "MaxAttempts": 1}, **kwargs)
            return describe()
        except WaiterError as error:
            if "Max attempts exceeded" not in str(error):
                # A terminal failure (Failed status, or the resource vanished).
                response = error.last_response or {}
                if "Error" in response:
                    raise DeployError(f"{label}: {response['Error'].get('Message', 'not found')}") from None
                reason = response.get("FailureReason") or "no FailureReason given"
                raise DeployError(f"{label} is {response.get(status_key, 'Failed')}: {reason}") from None
            status = (error.last_response or {}).get(status_key, "?")
        elapsed = time.monotonic() - started
        if status != last_status or poll_seconds >= 10:
            say(f"{label}: {status} ({elapsed:.0f}s)")
            last_status = status
        if elapsed + poll_seconds > max_wait_seconds:
            raise DeployError(f"{label} is still {status} after {elapsed:.0f}s; check it later or raise --max-wait")
        time.sleep(poll_seconds)



def wait_until(client, waiter, operation: str, label: str, status_key: str, poll_seconds: float, max_wait_seconds: float, **key):
    """wait_with_progress for a resource named by `key`, described by the client's `operation`.

    `waiter` is a waiter name of the client's own, or a botocore Waiter built here for
    resources botocore ships none for (inference components). Returns the last
    description, None once a resource waited out of existence is gone.
    """
    if isinstance(waiter, str):
        waiter = client.get_waiter(waiter)
    return wait_with_progress(waiter, lambda: describe(getattr(client, operation), **key), label, status_key, poll_seconds, max_wait_seconds, **key)


def describe(operation, **kwargs) -> dict | None:
    """The description, or None when the resource does not exist."""
    try:
        return operation(**kwargs)
    except ClientError as error:
        if is_not_found(error):
            return None
        raise


def delete(operation, **kwargs) -> bool:
    """True when something was deleted, False when it was already gone."""
    try:
        operation(**kwargs)
        return True
    except ClientError as error:
        if is_not_found(error):
            return False
        raise
