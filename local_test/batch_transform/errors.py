"""The runner's two failures: a job that cannot start, and a mini-batch that failed."""

from __future__ import annotations


class ConfigError(ValueError):
    """A job setting that cannot work; reported before any request is sent."""


class BatchFailed(Exception):
    """A mini-batch that did not produce usable output (after any retries)."""
