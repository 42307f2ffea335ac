"""How much the codecs cost: KServe v2 next to copying the tensor's bytes, and simple
JSON (`{"instances": [...]}`) next to orjson and numpy alone.

Decoding a binary request should cost nothing (the input is a view on the body);
encoding a binary response should cost about one copy (the tensor's bytes go into the
body once). JSON is shown for scale: it is the slow path the binary extension avoids.

The second table is a realistic application/json batch (--batch records of 64 floats,
an FP32 input, answers of 16 floats a record, issue 11): decode_inputs (the body decoded
and fitted to the model's input) beside the orjson route (orjson.loads, then a
conversion of the parsed lists), beside simdjson's reader that the fast path now uses
(jsondoc.c_doubles: C doubles, no Python float per number) and beside the
record-by-record path every JSON body took before numeric records got a fast path.

    .venv/bin/python bench/bench_codec.py [--mib 64] [--json-mib 4] [--repeat 5] [--batch 256]

Prints two tables; times are the best of the repeats, ratios are within this run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "container"))

import orjson  # noqa: E402

from smserve.codecs import records, simple, v2  # noqa: E402
from smserve.codecs.records import jsondoc  # noqa: E402
from smserve.core.metadata import ModelMetadata, TensorSpec  # noqa: E402
from smserve.protocols.simple import decode_inputs, json_inputs  # noqa: E402

MODEL = ModelMetadata(
    name="bench",
    inputs=(TensorSpec("x", "FP32", (-1,)),),
    outputs=(TensorSpec("y", "FP32", (-1,)),),
)


def best(fn, repeat: int) -> float:
    """Fastest of `repeat` runs, in seconds: the least disturbed by the rest of the machine."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def binary_request(array: np.ndarray) -> tuple[bytes, int]:
    header = json.dumps(
        {
            "inputs": [{"name": "x", "shape": list(array.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": array.nbytes}}],
            "parameters": {"binary_data_output": True},
        },
        separators=(",", ":"),
    ).encode()
    return header + array.tobytes(), len(header)


def json_request(array: np.ndarray) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "shape": list(array.shape), "datatype": "FP32", "data": array.tolist()}]},
        separators=(",", ":"),
    ).encode()


def round_trip(body: bytes, header_length: int | None) -> bytes:
    request = v2.decode_request(body, header_length, MODEL)
    response = v2.build_response(request, {"y": request.inputs["x"]}, MODEL)
    return v2.encode_response(response)[0]


def simple_json_table(batch: int, repeat: int) -> None:
    """decode_inputs and simple.encode of one realistic JSON batch, beside their floors."""
    metadata = ModelMetadata(name="mlp", max_batch_size=batch, inputs=(TensorSpec("x", "FP32", (64,)),),
                             outputs=(TensorSpec("y", "FP32", (16,)),))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 64)).astype(np.float32)
    y = {"y": rng.standard_normal((batch, 16)).astype(np.float32)}
    body = json.dumps({"instances": x.tolist()}).encode()
    rows = orjson.loads(body)["instances"]
    # Sanity: the fast path is taken and gives what the record-by-record path gives.
    assert isinstance(simple.parse_json(body)["instances"], np.ndarray)
    assert jsondoc.c_doubles(body, body.index(b"["), "instances") is not None  # simdjson's reader takes it
    fast = decode_inputs(body, simple.JSON, metadata)["x"]
    assert fast.dtype == np.float32 and np.array_equal(fast, x)
    assert np.array_equal(json_inputs(records.parse(body), metadata)["x"], x)

    repeat = max(repeat, 200)  # each call is a millisecond or so: many tries, keep the best
    loads = best(lambda: orjson.loads(body), repeat)
    times = [
        ("orjson.loads (parse alone)", loads),
        ("np.array(rows, float64) (conversion alone)", best(lambda: np.array(rows, dtype=np.float64), repeat)),
        ("jsondoc.float64_records (orjson route's conversion)", best(lambda: jsondoc.float64_records(rows), repeat)),
        ("jsondoc.c_doubles (simdjson: parse + convert)",
         best(lambda: jsondoc.c_doubles(body, body.index(b"["), "instances"), repeat)),
        ("decode_inputs (numeric fast path)", best(lambda: decode_inputs(body, simple.JSON, metadata), repeat)),
        ("record-by-record path (parse, check, convert)",
         best(lambda: json_inputs(records.parse(body), metadata), repeat)),
        (f"simple.encode of {batch}x16 FP32", best(lambda: simple.encode(y, simple.JSON), repeat)),
    ]
    print()
    print(f"Simple JSON, {{\"instances\": {batch}x64}} FP32 ({len(body) / 1024:.0f} KiB), best of {repeat}")
    print(f"| {'operation':<46} | {'time (ms)':>11} | {'ratio':>16} |")
    print(f"|{'-' * 48}|{'-' * 13}|{'-' * 18}|")
    for what, seconds in times:
        print(f"| {what:<46} | {seconds * 1e3:>11.3f} | {seconds / loads:>8.2f} x loads |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="binary tensor size in MiB (default 64)")
    parser.add_argument("--json-mib", type=int, default=4, help="JSON tensor size in MiB (default 4; scaled up)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256, help="records in the simple JSON batch (default 256)")
    args = parser.parse_args()

    mib = 1 << 20
    rng = np.random.default_rng(0)
    tensor = rng.random(args.mib * mib // 4, dtype=np.float32)
    body, header_length = binary_request(tensor)
    request = v2.decode_request(body, header_length, MODEL)
    response = v2.build_response(request, {"y": tensor}, MODEL)
    # Sanity: what we time really decodes and encodes this tensor.
    assert np.array_equal(request.inputs["x"], tensor)
    encoded, encoded_header = v2.encode_response(response)
    assert encoded[encoded_header:] == tensor.tobytes()

    copy = best(lambda: bytearray(body), args.repeat)
    decode = best(lambda: v2.decode_request(body, header_length, MODEL), args.repeat)
    encode = best(lambda: v2.encode_response(v2.build_response(request, {"y": tensor}, MODEL)), args.repeat)
    binary_trip = best(lambda: round_trip(body, header_length), args.repeat)

    json_tensor = tensor[: args.json_mib * mib // 4]
    json_body = json_request(json_tensor)
    json_repeat = max(1, min(args.repeat, 3))
    json_trip = best(lambda: round_trip(json_body, None), json_repeat)
    scale = tensor.nbytes / json_tensor.nbytes
    json_scaled = json_trip * scale

    def row(what: str, size: str, seconds: float, ratio: str) -> str:
        return f"| {what:<46} | {size:>14} | {seconds * 1e3:>11.3f} | {ratio:>16} |"

    print(f"KServe v2 codec, FP32 tensor of {args.mib} MiB, best of {args.repeat} (numpy {np.__version__})")
    print(f"| {'operation':<46} | {'tensor':>14} | {'time (ms)':>11} | {'ratio':>16} |")
    print(f"|{'-' * 48}|{'-' * 16}|{'-' * 13}|{'-' * 18}|")
    print(row("plain copy of the request body (bytearray)", f"{args.mib} MiB", copy, "1.00 x copy"))
    print(row("decode_request, binary (view on the body)", f"{args.mib} MiB", decode, f"{decode / copy:.4f} x copy"))
    print(row("build_response + encode_response, binary", f"{args.mib} MiB", encode, f"{encode / copy:.2f} x copy"))
    print(row("decode + encode, binary", f"{args.mib} MiB", binary_trip, f"{binary_trip / copy:.2f} x copy"))
    print(row("decode + encode, JSON (measured)", f"{args.json_mib} MiB", json_trip, ""))
    print(row(f"decode + encode, JSON (scaled x{scale:g} to {args.mib} MiB)", f"{args.mib} MiB", json_scaled,
              f"{json_scaled / binary_trip:.0f} x binary"))
    print(f"JSON was measured on the first {args.json_mib} MiB of the tensor ({json_tensor.size} floats, "
          f"{len(json_body) / mib:.1f} MiB of JSON) and scaled linearly by {scale:g}; a {args.mib} MiB JSON "
          "round trip takes too long to repeat.")
    simple_json_table(args.batch, args.repeat)


if __name__ == "__main__":
    main()
