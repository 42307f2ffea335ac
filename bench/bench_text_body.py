"""What handing input_fn a str costs for a big body (issue 47): the UTF-8 decode of a
JSON body against the json.loads that an input_fn then spends on it, in one process.

    .venv/bin/python bench/bench_text_body.py [--mb 50] [--rounds 7]

Two bodies of --mb MB: a JSON array of floats (ASCII, the usual tensor body) and JSON
text with non-ASCII letters (the decoder's slow path). Medians of --rounds each; the
ratio is what to read on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "container"))
from smserve.toolkit import text_body  # noqa: E402


def median_s(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    size = int(args.mb * 2**20)
    floats = json.dumps(np.random.default_rng(0).standard_normal(size // 20).tolist()).encode()
    word = json.dumps(["h\u00e9llo w\u00f6rld \u4e16\u754c " * 4], ensure_ascii=False).encode()[1:-1]
    text = b"[" + b",".join([word] * (size // (len(word) + 1))) + b"]"
    for name, body in (("float array (ASCII)", floats), ("text (non-ASCII)", text)):
        decode = median_s(lambda body=body: text_body(body, "application/json", "input_fn"), args.rounds)
        parse = median_s(lambda body=body: json.loads(body), max(1, args.rounds // 3))
        held = sys.getsizeof(text_body(body, "application/json", "input_fn")) / 2**20
        print(f"{name}: {len(body) / 2**20:.1f} MB, decode {decode * 1e3:.0f} ms, json.loads {parse * 1e3:.0f} ms, "
              f"decode / json.loads = {decode / parse:.3f}, the str {held:.1f} MB")


if __name__ == "__main__":
    main()
