"""Every request the tool builds, checked against botocore's service model as it is sent.

botocore itself checks types, required members and minimums before it sends; this adds
what it leaves to the service: enum values, maximums and patterns. moto accepts (or
drops) much that SageMaker refuses, so without this a request AWS would reject could
pass here. A request off the model raises AssertionError inside the tool, which its
one-line error handling does not catch: the test fails with the request named.
"""

from __future__ import annotations

import re

from botocore.validate import ParamValidator


class RequestLog:
    """The requests the tool's clients sent: (service, operation, params), in order."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict]] = []

    def __call__(self, service: str, operation: str | None = None) -> list[dict]:
        return [params for svc, op, params in self.calls if svc == service and (operation is None or op == operation)]

    def hook(self, service: str):
        def check(params, model, **_):
            problems = []
            report = ParamValidator().validate(params, model.input_shape)
            if report.has_errors():
                problems.append(report.generate_report())
            _check(model.input_shape, params, model.name, problems)
            assert not problems, f"{service} {model.name} request off botocore's model: {'; '.join(problems)}"
            self.calls.append((service, model.name, params))

        return check


def _check(shape, value, path: str, problems: list[str]) -> None:
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                _check(shape.members[name], member, f"{path}.{name}", problems)
    elif kind == "list" and isinstance(value, list):
        _bounds(shape, len(value), path, "items", problems)
        for index, item in enumerate(value):
            _check(shape.member, item, f"{path}[{index}]", problems)
    elif kind == "map" and isinstance(value, dict):
        for key, item in value.items():
            _check(shape.key, key, f"{path} key", problems)
            _check(shape.value, item, f"{path}[{key}]", problems)
    elif kind == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            problems.append(f"{path}: {value!r} is not one of {shape.enum}")
        _bounds(shape, len(value), path, "characters", problems)
        pattern = shape.metadata.get("pattern")
        compiled = _compile(pattern) if pattern else None
        if compiled is not None and not compiled.fullmatch(value):
            problems.append(f"{path}: {value!r} does not match {pattern}")
    elif kind in ("integer", "long", "float", "double") and isinstance(value, (int, float)):
        _bounds(shape, value, path, "", problems)


def _bounds(shape, measure, path: str, unit: str, problems: list[str]) -> None:
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    if low is not None and measure < low or high is not None and measure > high:
        problems.append(f"{path}: {measure} {unit} outside {low}..{high}".replace("  ", " "))


_COMPILED: dict[str, re.Pattern | None] = {}


def _compile(pattern: str) -> re.Pattern | None:
    """The model's (Java-flavoured) pattern in Python's re; None where re cannot read it.

    Matched against the whole value, as SageMaker's API reference shows them (^...$).
    """
    if pattern not in _COMPILED:
        translated = pattern.replace(r"\z", r"\Z")
        for name, span in (("ASCII", r"\x00-\x7f"), ("Print", r"\x20-\x7e")):
            translated = translated.replace(f"[\\p{{{name}}}]", f"[{span}]").replace(f"\\p{{{name}}}", f"[{span}]")
        try:
            _COMPILED[pattern] = re.compile(translated)
        except re.error:
            _COMPILED[pattern] = None
    return _COMPILED[pattern]
