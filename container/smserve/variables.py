"""How an environment variable's text becomes a setting's value: one parser per kind
(whole numbers, ports, seconds, milliseconds, booleans, names from a list, files and
folders), each raising ValueError with the text settings.py puts after the variable's
name. Pure functions over strings: settings.py reads the environment, not this module.

May import: core (the media types).
"""

from __future__ import annotations

import os
from typing import Callable

from smserve.core.media import MEDIA_TYPES

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# SAGEMAKER_CONTAINER_LOG_LEVEL as the SageMaker SDK sets it (logging's numbers), or a name.
LOG_LEVEL_NUMBERS = {"10": "debug", "20": "info", "30": "warning", "40": "error", "50": "critical"}
LOG_LEVEL_ALIASES = {"warn": "warning", "fatal": "critical"}
# SageMaker's own bound on MaxConcurrentTransforms x MaxPayloadInMB for a job.
MAX_TRANSFORM_BUDGET_MB = 100
# A lone request never waits longer than this for others to batch with.
MAX_BATCH_DELAY_MS = 1000


def whole_number(raw: str, low: int, high: int | None, message: str) -> int:
    """An integer from low to high (None: no upper bound); any other text is `message`."""
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(message) from None
    if value < low or (high is not None and value > high):
        raise ValueError(message)
    return value


def positive_int(raw: str) -> int:
    return whole_number(raw, 1, None, "must be a positive integer")


def port(raw: str) -> int:
    value = positive_int(raw)
    if value > 65535:
        raise ValueError("must be a TCP port (1-65535)")
    return value


def delay_ms(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"must be a number of milliseconds from 0 to {MAX_BATCH_DELAY_MS}") from None
    if not 0 <= value <= MAX_BATCH_DELAY_MS:  # also rejects nan and inf
        raise ValueError(f"must be a number of milliseconds from 0 to {MAX_BATCH_DELAY_MS}")
    return value


def seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("must be a number of seconds greater than 0") from None
    if not 0 < value <= 86400:  # also rejects nan and inf
        raise ValueError("must be a number of seconds greater than 0 (at most 86400)")
    return value


def boolean(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError("must be true or false")


def one_of(choices: tuple[str, ...], *, upper: bool = False) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.upper() if upper else raw.lower()
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def media_type(raw: str) -> str:
    value = raw.split(";")[0].strip().lower()
    if value not in MEDIA_TYPES:
        raise ValueError(f"must be one of {', '.join(MEDIA_TYPES)}")
    return value


def directory(raw: str) -> str:
    return os.path.abspath(raw)


def payload_mb(raw: str) -> int:
    """MaxPayloadInMB as CreateTransformJob takes it: 0 (no limit) to 100."""
    return whole_number(raw, 0, MAX_TRANSFORM_BUDGET_MB, f"must be a whole number of MB from 0 (no limit) to "
                                                          f"{MAX_TRANSFORM_BUDGET_MB} (SageMaker's limit)")


def concurrent_transforms(raw: str) -> int | None:
    """MaxConcurrentTransforms as CreateTransformJob takes it: 0 is unset (SageMaker
    then asks /execution-parameters), so None."""
    return whole_number(raw, 0, None, "must be a whole number >= 0 (0: not set)") or None


def log_level(raw: str) -> str:
    """A level name (any case), or logging's number for one (the SDK writes "20")."""
    value = LOG_LEVEL_NUMBERS.get(raw) or LOG_LEVEL_ALIASES.get(raw.lower()) or raw.lower()
    if value not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)} or logging's number for one "
                         f"({', '.join(LOG_LEVEL_NUMBERS)})")
    return value


def program(raw: str) -> str:
    """A script's file name, as SAGEMAKER_PROGRAM holds it ("mnist.py"; a module's
    name, "mnist", as the toolkit also takes it)."""
    if "/" in raw or raw in (".", "..", ".py"):
        raise ValueError("must be the name of a Python file in the model's code/ folder, such as inference.py")
    return raw if raw.endswith(".py") else raw + ".py"


def device(raw: str) -> str:
    value = raw.lower()
    if value in ("auto", "cpu", "cuda"):
        return value
    raise ValueError("must be auto, cpu or cuda")
