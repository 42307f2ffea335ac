"""Errors that carry their HTTP status; the app turns them into responses in one place."""

import os


class HTTPError(Exception):
    """An error the client should see, with the HTTP status that describes it."""

    status = 500
    # Whoever raised it has logged its cause already (a hook's or the model's failure,
    # with its traceback): the route does not log it again, so a failure is one ERROR.
    logged = False

    def __init__(self, message: str, status: int | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        # Sent with the error answer (a 405's Allow, a 503's Retry-After).
        self.headers = headers or {}


class BadRequest(HTTPError):
    status = 400


class NotFound(HTTPError):
    status = 404


class MethodNotAllowed(HTTPError):
    status = 405


class NotAcceptable(HTTPError):
    status = 406


class Conflict(HTTPError):
    status = 409


class PayloadTooLarge(HTTPError):
    status = 413


class UnsupportedMediaType(HTTPError):
    status = 415


class TooManyRequests(HTTPError):
    """A bound on what the client may hold is reached (a worker's open sessions)."""

    status = 429


class ServerError(HTTPError):
    """The model or the server failed: not the client's fault."""

    status = 500


class Unavailable(HTTPError):
    status = 503


class AnswerTimeout(HTTPError):
    """The model did not answer within the request's deadline (SAGEMAKER_MODEL_SERVER_TIMEOUT):
    the worker goes on, the late result is dropped."""

    status = 504


class InsufficientStorage(HTTPError):
    """No room for another model (SageMaker's multi-model API: it then unloads one and retries)."""

    status = 507


class Named500:
    """`with Named500(prefix, kinds):` an exception of one of `kinds` raised inside
    becomes a 500 whose message says what failed ("<prefix>: <type>: <message>", the
    exception its cause); an HTTPError passes as it is. A class, not a contextlib
    generator: every inference enters such a context several times, and a class is the
    cheaper one to enter."""

    __slots__ = ("prefix", "kinds")

    def __init__(self, prefix: str, kinds: tuple[type[BaseException], ...] = (Exception,)):
        self.prefix = prefix
        self.kinds = kinds

    def __enter__(self) -> "Named500":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None or issubclass(kind, HTTPError) or not issubclass(kind, self.kinds):
            return False
        raise ServerError(f"{self.prefix}: {kind.__name__}: {error}") from error


def json_error_body(message: str) -> bytes:
    """The one error body every 4xx and 5xx carries: {"error": "<message>"}."""
    import json

    return json.dumps({"error": message}, separators=(",", ":")).encode()


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))  # smserve/


def user_frames_first(error: BaseException):
    """exc_info for error whose traceback starts where the server handed over to the
    user's code (a hook, the model): the server's own frames above it say nothing to
    the hook's author."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None and \
            os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        tb = tb.tb_next
    return type(error), error, tb
