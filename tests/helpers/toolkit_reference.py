"""What AWS's PyTorch containers answer for a script, from their own code, in-process:
sagemaker_inference's Transformer with the PyTorch toolkit's default handler (as its
handler_service builds it), and TorchServe's way of writing what that returns
(ts/protocol/otf_message_handler.py, create_predict_response: bytes as they are, a str
as UTF-8, a tensor torch.save'd, anything else json.dumps(value, indent=2), and a 503
where json cannot write it). Tests compare the server's answers with these rather than
with answers written by hand."""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from sagemaker_inference.transformer import Transformer
from sagemaker_pytorch_serving_container.default_pytorch_inference_handler import DefaultPytorchInferenceHandler


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str | None


class _Request:
    def __init__(self, headers: dict):
        self.headers = headers

    def get_request_properties(self):
        return self.headers


class _Context:
    """The fields of TorchServe's Context that the Transformer reads and sets."""

    def __init__(self, model_dir: str, headers: dict):
        self.system_properties = {"model_dir": model_dir, "gpu_id": None}
        self.request_processor = [_Request(headers)]
        self.status, self.content_type = 200, None

    def set_response_status(self, code, phrase=None):
        self.status = code

    def set_response_content_type(self, idx, content_type):
        self.content_type = content_type


def torchserve_body(value) -> tuple[int, bytes]:
    """(status, body) as TorchServe writes a handler's answer for one request."""
    if isinstance(value, (bytes, bytearray)):
        return 200, bytes(value)
    if isinstance(value, str):
        return 200, value.encode("utf-8")
    if isinstance(value, torch.Tensor):
        out = io.BytesIO()
        torch.save(value, out)
        return 200, out.getvalue()
    try:
        return 200, json.dumps(value, indent=2).encode("utf-8")
    except TypeError:
        return 503, b"Unsupported model output data type."


@contextmanager
def _environment(code_dir: Path, program: str):
    saved_env, saved_path = os.environ.get("SAGEMAKER_PROGRAM"), list(sys.path)
    os.environ["SAGEMAKER_PROGRAM"] = program
    sys.path.insert(0, str(code_dir))
    try:
        yield
    finally:
        sys.path[:] = saved_path
        if saved_env is None:
            os.environ.pop("SAGEMAKER_PROGRAM", None)
        else:
            os.environ["SAGEMAKER_PROGRAM"] = saved_env


class Toolkit:
    """One model served by the toolkit's handler (model_fn runs once, at the first request)."""

    def __init__(self, model_dir: Path, program: str):
        self.model_dir, self.program = Path(model_dir), program
        self.transformer = Transformer(default_inference_handler=DefaultPytorchInferenceHandler())

    def answer(self, body: bytes, content_type: str, accept: str | None = None) -> Answer:
        headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {})}
        context = _Context(str(self.model_dir), headers)
        with _environment(self.model_dir / "code", self.program):
            [result] = self.transformer.transform([{"body": body}], context)
        if context.status != 200:
            return Answer(context.status, str(result).encode(), context.content_type)
        status, written = torchserve_body(result)
        return Answer(status, written, context.content_type)
