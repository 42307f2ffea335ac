"""The CLI's commands, one module per group: artifacts (push, package, create-model),
endpoints (create-endpoint, update-endpoint, teardown) and requests (invoke,
invoke-async, transform). Each module's add() declares its parsers; a parser's
handler(aws, args, runner) yields the lines to print.
"""

from __future__ import annotations

import argparse
import dataclasses


def items(values: list[str] | None) -> list[str]:
    """Repeatable, comma-separated options as one list: --subnets a,b --subnets c -> [a, b, c]."""
    return [item.strip() for value in values or [] for item in value.split(",") if item.strip()]


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def from_args(cls, args: argparse.Namespace, **given):
    """A dataclass whose fields are named as the command's options, each taken from args
    unless given here (a field spelled differently from its flag); others keep their defaults."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in given and hasattr(args, f.name)}
    return cls(**values, **given)
