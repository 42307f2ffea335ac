"""Start a model directory for this server from an exported model.

    python -m model.init DIR [--name NAME] [--force]        (or: make new-model DIR=...)

DIR holds model.pt2 (torch.export.save) or model.pt (torch.jit.save). Writes, next to it:

- metadata.json: what the server derives from the model when the file is absent (the
  same code, container/smserve/engine/worker/loaded_model.py), with a comment on each field,
  so that what is guessed can be corrected: names, shapes, the batch size, class labels.
- code/inference.py: the four SageMaker PyTorch hooks, all commented out; uncomment
  the ones you need.

Existing files are kept unless --force. Then: make serve MODEL_DIR=DIR.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "container"))

from smserve.core.metadata import METADATA_FILE, ModelMetadata  # noqa: E402
from smserve.engine.model.artifacts import EXPORTED, TORCHSCRIPT, ModelLoadError  # noqa: E402

INFERENCE_PY = '''\
"""Hooks for {name}, as in SageMaker's PyTorch toolkit. Each one defined replaces that
built-in step; leave one commented out to keep the built-in. They run on the worker's
inference thread, never on the event loop, so a slow one does not block /ping.
Extra packages: list them in code/requirements.txt (see the README).

input_fn, predict_fn and output_fn may take a last parameter named `context` (drop it
if you do not need it): the request's SageMaker headers, read-only -
context.custom_attributes (X-Amzn-SageMaker-Custom-Attributes, or None),
context.inference_id, context.target_model, context.headers (any header, in any case),
context.path, context.query - and context.response_custom_attributes, which you may set
to a str sent back as X-Amzn-SageMaker-Custom-Attributes (the caller's CustomAttributes).
Each request has its own; a predict_fn that runs on a batch of several requests
(max_batch_size > 0 in metadata.json, and no input_fn or output_fn) gets None.
See docs/model.md, "The request's context"."""

# import torch


# def model_fn(model_dir):
#     """Load and return the model; you choose its device. Built-in: loads {artifact}
#     onto the worker's GPU (worker i -> GPU i mod n) or the CPU."""
#     ...


# def input_fn(body, content_type, context):
#     """bytes -> what predict_fn takes. Any Content-Type reaches it except the KServe
#     v2 forms. Raise ValueError (or smserve.errors.BadRequest) for a 400.
#     Built-in: JSON, CSV, JSON Lines, .npy -> a tensor on the worker's device.
#     context.custom_attributes: the caller's CustomAttributes (or None)."""
#     ...


# def predict_fn(data, model, context):
#     """Built-in: model(data) under torch.inference_mode(); several inputs arrive as a
#     dict and are passed positionally in metadata.json's order. context: the
#     request's, or None when this call runs a batch of several requests."""
#     ...


# def output_fn(prediction, accept, context):
#     """-> bytes or str, or (body, content_type). Built-in: encoded by Accept
#     (application/json, text/csv, application/jsonlines, application/x-npy).
#     context.response_custom_attributes = "..." answers with the caller's CustomAttributes."""
#     ...
'''


def derive(model_dir: Path) -> tuple[ModelMetadata, str, str | None]:
    """(metadata, artifact name, a note on its outputs or None): exactly what the server
    derives without metadata.json, read the way the server reads the file (a pickle is
    refused, with how to save the model instead)."""
    from smserve.engine.model import artifacts
    from smserve.engine.model.derived import from_export, from_torchscript

    try:
        if (model_dir / EXPORTED).exists():
            return from_export(artifacts.load_exported(str(model_dir / EXPORTED))), EXPORTED, None
        if (model_dir / TORCHSCRIPT).exists():
            module = artifacts.load_torchscript(str(model_dir / TORCHSCRIPT), map_location="cpu")
            return from_torchscript(module), TORCHSCRIPT, _torchscript_outputs_note(module)
    except ModelLoadError as e:
        raise SystemExit(f"model.init: {e}") from None
    raise SystemExit(
        f"model.init: {model_dir} holds neither {EXPORTED} (torch.export.save) nor {TORCHSCRIPT} (torch.jit.save)"
    )


def _torchscript_outputs_note(module) -> str:
    """What forward's return type says about the outputs, for metadata.json's comment."""
    from smserve.engine.model.derived import torchscript_output_count

    returned = str(module.forward.schema.returns[0].type) if module.forward.schema.returns else "?"
    count = torchscript_output_count(module)
    if count is None:
        return (f"forward returns {returned}: how many outputs (or, for a dict, their names) is known only "
                "when it runs, so one is listed here and the server answers every one the model returns "
                "(a list's as output__0, output__1, ...; a dict's by its keys): list them all here")
    return f"derived from forward's return type, {returned}: {count} output{'s' if count > 1 else ''}"


def metadata_document(metadata: ModelMetadata, artifact: str, name: str, outputs_note: str | None = None) -> dict:
    """metadata.json's content. JSON has no comments: keys starting with '_' carry them,
    and the server ignores every key it does not know."""
    unknown_shape = any(spec.shape is None or -1 in spec.shape for spec in (*metadata.inputs, *metadata.outputs))
    batch_note = (
        f"derived: {metadata.max_batch_size}, because dimension 0 of every input is dynamic in {artifact}, so it "
        "is taken as the batch; raise it to what fits your device"
        if metadata.max_batch_size
        else f"derived: 0, because {artifact} does not say dimension 0 is a dynamic batch; set it (> 0) if "
        "dimension 0 is the batch, so requests are batched together"
    )
    def tensor(spec, role):
        entry = {"name": spec.name, "datatype": spec.datatype, "shape": None if spec.shape is None else list(spec.shape)}
        if role == "output":
            entry["labels"] = None
        return entry

    return {
        "_comment": [
            f"Written by `python -m model.init` from {artifact}. Keys starting with _ are ignored.",
            "name, version: the model's name in KServe v2 URLs (/v2/models/NAME/infer) and metadata.",
            "max_batch_size: " + batch_note + ". > 0: dimension 0 is the batch and 'shape' is one sample's "
            "shape (clients see [-1, ...]); 0: the model takes whole tensors, requests never share a pass.",
            "inputs: " + ("the exported graph's placeholder names" if artifact == EXPORTED else
                          "TorchScript forward()'s argument names") + "; requests name inputs this way "
            "(KServe v2). Positional order is the model's.",
            "outputs: named output__0, output__1, ... in the order the model returns them; rename them freely"
            + (f" ({outputs_note})." if outputs_note else "."),
            "datatype: a KServe v2 name: BOOL, UINT8..UINT64, INT8..INT64, FP16, BF16, FP32, FP64, BYTES.",
            "shape: -1 marks a variable dimension; a raw binary request's shape is deduced from its size, "
            "so give at most one -1 per input. null: not known, any shape is taken (a wrong one fails in "
            "the model, a 500, not a 400) and the model is not warmed up." + (
                " Some shapes are unknown (null or -1) here: write the real ones." if unknown_shape else ""),
            "labels: null, or one class name per entry of the output's last dimension (the classification "
            "extension answers with them).",
        ],
        "name": name,
        "version": metadata.version,
        "max_batch_size": metadata.max_batch_size,
        "inputs": [tensor(spec, "input") for spec in metadata.inputs],
        "outputs": [tensor(spec, "output") for spec in metadata.outputs],
    }


def write(path: Path, text: str, force: bool) -> bool:
    if path.exists() and not force:
        print(f"model.init: kept {path} (exists; --force replaces it)", file=sys.stderr)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"model.init: wrote {path}", file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.init", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, metavar="DIR", help="a folder holding model.pt2 or model.pt")
    parser.add_argument("--name", default="model", help="the model's name (default: model)")
    parser.add_argument("--force", action="store_true", help="replace metadata.json and code/inference.py")
    args = parser.parse_args(argv)
    if not args.model_dir.is_dir():
        parser.error(f"{args.model_dir} is not a directory")
    metadata, artifact, outputs_note = derive(args.model_dir)
    document = metadata_document(metadata, artifact, args.name, outputs_note)
    # The server must read back what it would have derived: checked before writing.
    ModelMetadata.from_dict(document)
    write(args.model_dir / METADATA_FILE, json.dumps(document, indent=2) + "\n", args.force)
    write(args.model_dir / "code" / "inference.py", INFERENCE_PY.format(name=args.name, artifact=artifact), args.force)
    print(f"next: make serve MODEL_DIR={args.model_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
