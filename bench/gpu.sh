#!/usr/bin/env bash
# The GPU benchmark as one prepared command: builds two models, serves each
# with the real server at SMSERVE_AUTOCAST=off/fp16/bf16 and prints one table of
# throughput, p50/p99 latency and memory at batch 1/64/256. About 4 minutes on a GPU.
#
#   bash bench/gpu.sh                   from the repository root, after `make install`
#                                       (TORCH_VARIANT=cuda on a GPU host; the default there)
#   bash bench/gpu.sh --quick           2 s a case (the default when torch sees no GPU)
#   bash bench/gpu.sh --compile default adds SMSERVE_COMPILE rows; --help for the rest
#
# Without a GPU it runs the same cases on the CPU and says so. `hey` drives the load
# where it is installed (apt-get install hey); else a Python client does.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${VENV:-.venv}/bin/python"
if [ ! -x "$PY" ]; then
    echo "no $PY: run 'make install' first (TORCH_VARIANT=cuda on a GPU host)" >&2
    exit 1
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA" if torch.cuda.is_available() else "CPU only", file=__import__("sys").stderr)'
"$PY" bench/bench_gpu.py "$@"
# A model's own input format on the device: the image example fed JPEG through its input_fn
# against prepared .npy (hook threads decoding while the GPU runs passes). Its CUDA checks
# (input_fn's tensors on the worker's GPU, the hooks' current device) are a test:
# .venv/bin/python -m pytest tests/integration/test_gpu_hooks.py
# The served model against its own limit: a ResNet-50-sized model (fp16 autocast) through
# /invocations from 64 clients against torch alone on the same GPU, by batch size (~2 min).
if command -v hey >/dev/null 2>&1; then
    "$PY" bench/bench_image.py --torch-threads 0 --seconds 5 --rounds 2 --hook-processes 8
    "$PY" bench/bench_gpu_limit.py
else
    echo "bench_image and bench_gpu_limit skipped: they need hey (apt-get install hey)" >&2
fi
