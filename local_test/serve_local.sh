#!/usr/bin/env bash
# Serves a model from a local image the way SageMaker does: the model directory
# mounted read-only at /opt/ml/model, port 8080, and the argument `serve`.
#
#   local_test/serve_local.sh IMAGE [MODEL_DIR]       (MODEL_DIR defaults to build/model)
#
# Environment: PORT (host port, 8080), RUN_NAME (for `make stop`), GPUS (auto:
# hand the host's GPUs to the container when nvidia-smi finds any; none: never), and
# any SAGEMAKER_* / SMSERVE_* variables, which are passed into the container.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
image=${1:?usage: $0 IMAGE [MODEL_DIR]}
model_dir=$(cd "${2:-$here/../build/model}" && pwd)
port=${PORT:-8080}
name=${RUN_NAME:-sagemaker-pytorch-byoc}
engine=$("$here/container_engine.sh")

args=(run --rm --name "$name" -p "$port:${SAGEMAKER_BIND_TO_PORT:-8080}"
    -v "$model_dir:/opt/ml/model:ro")

# The model server's settings travel as the container's environment, as SageMaker
# passes them (create_model's Environment).
while IFS='=' read -r var _; do
    args+=(-e "$var")
done < <(env | grep -E '^(SAGEMAKER|SMSERVE)_' || true)

if [[ ${GPUS:-auto} == auto ]] && command -v nvidia-smi >/dev/null 2>&1 \
    && nvidia-smi -L >/dev/null 2>&1; then
    # Docker's NVIDIA runtime and podman's CDI spec name the same thing differently.
    if [[ $engine == docker ]]; then args+=(--gpus all); else args+=(--device nvidia.com/gpu=all); fi
fi

echo "$engine ${args[*]} $image serve" >&2
exec "$engine" "${args[@]}" "$image" serve
