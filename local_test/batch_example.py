"""The README's local batch transform, end to end (`make batch-example`).

    .venv/bin/python -m local_test.batch_example [--model-dir build/model] [--work build/batch-example]

Writes the example input (the 450 held-out digits the example model was scored on,
one CSV record a line) to WORK/in/digits.csv, serves the model in batch mode
(SAGEMAKER_BATCH=true) on a free port, runs local_test/batch_transform.py on WORK/in
into WORK/out exactly as the README shows it, checks the answers against the labels,
and stops the server. Exit status: the runner's (0 when every mini-batch succeeded).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from local_test import batch_transform
from local_test.server_process import EXAMPLE_MODEL, ROOT, ServerProcess


def write_input(directory: Path) -> np.ndarray:
    """WORK/in/digits.csv: one digit (64 pixel values) a line. Returns the labels."""
    from model.train import load_split

    _, x_test, _, y_test = load_split()
    directory.mkdir(parents=True, exist_ok=True)
    np.savetxt(directory / "digits.csv", x_test, delimiter=",", fmt="%g")
    return y_test


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=EXAMPLE_MODEL)
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "batch-example")
    args = parser.parse_args(argv)

    labels = write_input(args.work / "in")
    print(f"input: {args.work / 'in' / 'digits.csv'} ({len(labels)} records)", file=sys.stderr)
    with ServerProcess(args.model_dir, {"SAGEMAKER_BATCH": "true", "SMSERVE_LOG_LEVEL": "warning"},
                       log_path=args.work / "server.log") as server:
        status = batch_transform.main([
            str(args.work / "in"), str(args.work / "out"), "--url", server.url,
            "--content-type", "text/csv", "--accept", "text/csv", "--no-progress",
        ])
    output = args.work / "out" / "digits.csv.out"
    if status == 0 and output.exists():
        predicted = np.loadtxt(output, delimiter=",", ndmin=2).argmax(axis=1)
        print(f"output: {output} ({len(predicted)} lines); accuracy against the labels: "
              f"{(predicted == labels).mean():.3f}")
    return status


if __name__ == "__main__":
    sys.exit(main())
