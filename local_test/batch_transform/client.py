"""HTTP to the container: /ping, /execution-parameters, and POST /invocations with
ModelClientConfig's retries."""

from __future__ import annotations

import threading
import time

import requests

from local_test.batch_transform.config import JobConfig
from local_test.batch_transform.errors import BatchFailed, ConfigError


class EndedEarly(Exception):
    """An answer that began (HTTP 200) but ended before its end: its chunked body has
    no final chunk. The server streams a many-pass CSV or JSON Lines answer pass by
    pass, so a model that fails on a later pass can only cut the answer short."""

    def __init__(self, received: bytes):
        super().__init__("the answer ended early")
        self.received = received

    @property
    def lines(self) -> int:
        return self.received.count(b"\n")


class Client:
    """One requests.Session per thread: a Session's connection pool is not thread-safe."""

    def __init__(self, config: JobConfig):
        self.config = config
        self._local = threading.local()

    @property
    def session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def invoke(self, body: bytes, records: int | None = None) -> bytes:
        """POST /invocations with ModelClientConfig's retry rule.

        Connection errors, timeouts and 5xx are retried up to max_retries times; a 4xx
        is the request's own fault and would fail the same way again. An answer that
        ends early (see EndedEarly) is retried too, as SageMaker would, unless a retry
        ends at the very same byte: a model that fails on a later pass does so every
        time, and a dying worker would not stop at the same place twice.
        """
        config = self.config
        url = config.url.rstrip("/") + "/invocations"
        headers = {"Content-Type": config.request_content_type}
        if config.accept:
            headers["Accept"] = config.accept
        last_error = ""
        ended_at: int | None = None  # how much the last answer that ended early held
        tries = 0
        for attempt in range(config.max_retries + 1):
            if attempt:
                time.sleep(config.retry_backoff_s * 2 ** (attempt - 1))
            tries += 1
            try:
                response = self.session.post(
                    url, data=body, headers=headers, timeout=(config.timeout_s, config.timeout_s), stream=True
                )
                if response.status_code == 200:
                    return _whole_answer(response)
                content = response.content
            except EndedEarly as early:
                last_error = _ended_early(early, records)
                if ended_at == len(early.received):
                    raise BatchFailed(f"{last_error}; a retry ended at the same place, so it is not retried "
                                      f"again (after {tries} attempts)") from None
                ended_at = len(early.received)
                continue
            except (
                requests.ConnectionError,
                requests.Timeout,
                requests.exceptions.ChunkedEncodingError,
            ) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
                continue
            last_error = f"HTTP {response.status_code}: {_short(content.decode('utf-8', 'replace'))}"
            if response.status_code < 500:
                raise BatchFailed(last_error)
        raise BatchFailed(f"{last_error} (after {tries} attempt{'s' if tries > 1 else ''})")


def _whole_answer(response: requests.Response) -> bytes:
    """A 200 answer's body; EndedEarly with what came when it breaks off. A read that
    times out is a requests.ConnectionError, left to the caller."""
    received = bytearray()
    try:
        for chunk in response.iter_content(64 * 1024):
            received += chunk
    except requests.exceptions.ChunkedEncodingError:
        raise EndedEarly(bytes(received)) from None
    finally:
        response.close()
    return bytes(received)


def _ended_early(early: EndedEarly, records: int | None) -> str:
    of = f" of {records}" if records is not None else ""
    return (
        f"the server's answer ended early, after {early.lines}{of} lines: HTTP 200 and the first lines had "
        "left when the model failed part-way through (a later forward pass raised), or its worker died; "
        "the server's log says why"
    )


def _short(text: str, limit: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


def wait_for_ping(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            response = requests.get(url.rstrip("/") + "/ping", timeout=5)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except requests.RequestException as exc:
            last = f"{type(exc).__name__}"
        if time.monotonic() >= deadline:
            raise ConfigError(f"{url}/ping did not answer 200 within {timeout_s:g} s (last: {last})")
        time.sleep(0.5)


def fetch_execution_parameters(url: str) -> dict:
    """GET /execution-parameters; SageMaker's defaults when the container has none."""
    try:
        response = requests.get(url.rstrip("/") + "/execution-parameters", timeout=10)
    except requests.RequestException as exc:
        raise ConfigError(f"cannot reach {url}: {exc}") from None
    if response.status_code == 404:
        return {}
    if response.status_code != 200:
        raise ConfigError(
            f"GET /execution-parameters answered HTTP {response.status_code}: {_short(response.text)}"
        )
    try:
        params = response.json()
    except ValueError:
        raise ConfigError("GET /execution-parameters did not return JSON") from None
    if not isinstance(params, dict):
        raise ConfigError("GET /execution-parameters did not return a JSON object")
    return params
