"""One KServe v2 binary request from CSV files, for any model: `predict.sh --v2-binary`.

    python3 local_test/v2_request.py [--url URL] [--model NAME] [CSV | NAME=CSV ...]

Reads the served model's input names, datatypes and shapes from GET /v2/models/NAME,
packs each input's CSV values in that datatype (little-endian, row-major, as the binary
extension lays them out), and posts them to /invocations in the form SageMaker passes
through: the JSON header's length travels in the Content-Type, because SageMaker drops
custom request headers such as Inference-Header-Content-Length. Every output comes back
in binary (FP16 and BF16 can travel no other way) and is printed as a v2 JSON answer.

A one-input model takes one CSV; a model of several takes NAME=CSV for each input. A
CSV's rows are samples along a batch dimension (-1 first in the shape); any other one
variable dimension is deduced from the number of values.

The model's name: --model (or $MODEL_NAME); else the "name" in $MODEL_DIR/metadata.json
(MODEL_DIR defaults to build/model, what `make serve` serves); else "model", the name a
model without metadata.json is served under. The server says which of them it serves.

The system's python3 runs it: standard library only, so no venv is needed.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import struct
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CSV = ROOT / "local_test" / "payloads" / "digits.csv"
SAGEMAKER_BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="
# The binary extension's element layouts that struct packs directly; BF16 and BYTES are
# laid out by hand below.
STRUCT = {"BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q", "INT8": "b", "INT16": "h",
          "INT32": "i", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d"}


class Refused(Exception):
    """Something this script cannot send, said in one line."""


# ---------------------------------------------------------------- the model


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, {}
    except urllib.error.URLError as e:
        raise Refused(f"cannot reach {url}: {e.reason}") from None


def candidate_names(given: str | None, model_dir: Path) -> list[str]:
    if given:
        return [given]
    names = []
    try:
        name = json.loads((model_dir / "metadata.json").read_text()).get("name")
        if isinstance(name, str):
            names.append(name)
    except (OSError, ValueError, AttributeError):
        pass
    if "model" not in names:
        names.append("model")
    return names


def model_metadata(base: str, names: list[str]) -> dict:
    """The v2 metadata of the first of these names the server serves."""
    for name in names:
        status, metadata = get_json(f"{base}/v2/models/{urllib.request.quote(name, safe='')}")
        if status == 200:
            return metadata
    raise Refused(f"the server at {base} serves no model named {' or '.join(map(repr, names))}: give --model "
                  "NAME, the 'name' in the served model's metadata.json (or set MODEL_DIR to its folder)")


# ---------------------------------------------------------------- request


def read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        rows = [[cell.strip() for cell in row] for row in csv.reader(f) if row]
    if not rows:
        raise Refused(f"{path} holds no rows")
    if any(len(row) != len(rows[0]) for row in rows):
        raise Refused(f"{path}: rows of different lengths ({len(rows[0])} columns in row 1)")
    return rows


def shape_for(declared: list[int], rows: int, columns: int, name: str) -> list[int]:
    count = rows * columns
    if declared == [-1]:
        # v2 says [-1] both for "any rank" and for one variable dimension: a one-row
        # CSV is a vector, more rows a matrix.
        return [count] if rows == 1 else [rows, columns]
    shape = list(declared)
    if len(shape) > 1 and shape[0] == -1:
        shape[0] = rows  # the batch dimension: one CSV row a sample
    unknown = [i for i, d in enumerate(shape) if d == -1]
    known = math.prod(d for d in shape if d != -1)
    if len(unknown) == 1 and known and count % known == 0:
        shape[unknown[0]] = count // known
    if -1 in shape or math.prod(shape) != count:
        raise Refused(f"input {name!r}: {rows} rows of {columns} values do not fit its shape {declared}")
    return shape


def pack(datatype: str, cells: list[str], name: str) -> bytes:
    """The cells as the binary extension lays out `datatype`."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(b)) + b for b in (cell.encode() for cell in cells))
    if datatype == "BF16":
        return b"".join(_bf16(_value(datatype, cell, name)) for cell in cells)
    if datatype not in STRUCT:
        raise Refused(f"input {name!r}: datatype {datatype} is not one this script packs")
    code = STRUCT[datatype]
    values = [_value(datatype, cell, name) for cell in cells]
    try:
        return struct.pack(f"<{len(values)}{code}", *values)
    except (struct.error, OverflowError) as e:
        raise Refused(f"input {name!r}: a value does not fit {datatype}: {e}") from None


def _value(datatype: str, cell: str, name: str):
    if datatype == "BOOL":
        if cell.lower() in ("1", "true"):
            return True
        if cell.lower() in ("0", "false"):
            return False
    elif datatype.startswith(("INT", "UINT")):
        try:
            return int(cell)
        except ValueError:
            pass
    else:
        try:
            return float(cell)
        except ValueError:
            pass
    raise Refused(f"input {name!r}: {cell!r} is not a {datatype} value")


def _bf16(value: float) -> bytes:
    """The upper half of the float32, rounded to nearest even, as torch rounds."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    if math.isnan(value):
        return struct.pack("<H", 0x7FC0)
    return struct.pack("<H", ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF)


def build_request(metadata: dict, sources: dict[str, Path]) -> tuple[bytes, bytes]:
    """The JSON header, and the inputs' blobs in the order the header lists them."""
    inputs, blobs = [], []
    for spec in metadata["inputs"]:
        name = spec["name"]
        rows = read_csv(sources[name])
        shape = shape_for(spec["shape"], len(rows), len(rows[0]), name)
        blob = pack(spec["datatype"], [cell for row in rows for cell in row], name)
        inputs.append({"name": name, "shape": shape, "datatype": spec["datatype"],
                       "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}},
                        separators=(",", ":")).encode()
    return header, b"".join(blobs)


def sources_for(metadata: dict, arguments: list[str]) -> dict[str, Path]:
    names = [spec["name"] for spec in metadata["inputs"]]
    named = dict(a.split("=", 1) for a in arguments if "=" in a)
    bare = [a for a in arguments if "=" not in a]
    if not named and len(names) == 1:
        if len(bare) > 1:
            raise Refused(f"the model has one input ({names[0]}): give one CSV")
        return {names[0]: Path(bare[0]) if bare else DEFAULT_CSV}
    if bare or sorted(named) != sorted(names):
        raise Refused(f"the model's inputs are {', '.join(names)}: give one NAME=CSV for each "
                      f"(given: {', '.join(arguments) or 'none'})")
    return {name: Path(path) for name, path in named.items()}


# ---------------------------------------------------------------- answer


def unpack(datatype: str, blob: bytes) -> list:
    if datatype == "BYTES":
        values, at = [], 0
        while at < len(blob):
            (length,) = struct.unpack_from("<I", blob, at)
            values.append(blob[at + 4:at + 4 + length].decode("utf-8", "replace"))
            at += 4 + length
        return values
    if datatype == "BF16":
        return [struct.unpack("<f", struct.pack("<I", half << 16))[0]
                for (half,) in struct.iter_unpack("<H", blob)]
    return [v for (v,) in struct.iter_unpack("<" + STRUCT[datatype], blob)]


def nested(values: list, shape: list[int]) -> list:
    if len(shape) <= 1:
        return values
    step = len(values) // shape[0] if shape[0] else 0
    return [nested(values[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def decode_answer(body: bytes, content_type: str) -> dict:
    """The v2 answer with every binary output's values put back as "data"."""
    size = content_type.split("json-header-size=", 1)[1].split(";")[0] if "json-header-size=" in content_type else ""
    length = int(size) if size.strip().isdigit() else len(body)
    answer = json.loads(body[:length])
    at = length
    for output in answer.get("outputs", []):
        blob_size = output.get("parameters", {}).pop("binary_data_size", None)
        if blob_size is None:
            continue
        output["data"] = nested(unpack(output["datatype"], body[at:at + blob_size]), output["shape"])
        at += blob_size
        if not output["parameters"]:
            del output["parameters"]
    return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="predict.sh --v2-binary", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=f"http://{os.environ.get('HOST', 'localhost')}:{os.environ.get('PORT', '8080')}")
    parser.add_argument("--model", default=os.environ.get("MODEL_NAME"), help="the served model's name")
    parser.add_argument("csv", nargs="*", metavar="CSV | NAME=CSV", help=f"default: {DEFAULT_CSV.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    base = args.url.rstrip("/")
    try:
        metadata = model_metadata(base, candidate_names(args.model, Path(os.environ.get("MODEL_DIR", ROOT / "build" / "model"))))
        header, blobs = build_request(metadata, sources_for(metadata, args.csv))
    except (Refused, OSError) as e:
        print(f"predict.sh --v2-binary: {e}", file=sys.stderr)
        return 2
    print(f"POST {base}/invocations (model {metadata['name']!r})", file=sys.stderr)
    request = urllib.request.Request(base + "/invocations", data=header + blobs, method="POST",
                                     headers={"Content-Type": f"{SAGEMAKER_BINARY}{len(header)}"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = decode_answer(response.read(), response.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as e:
        print(e.read().decode("utf-8", "replace"))
        print(f"HTTP {e.code}", file=sys.stderr)
        return 1
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
