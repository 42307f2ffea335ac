#!/usr/bin/env bash
# Sends one request to a locally served model (local_test/serve_local.sh or `make run`)
# and prints the response.
#
#   local_test/predict.sh PAYLOAD [CONTENT_TYPE [ACCEPT]]
#       posts the file as is; CONTENT_TYPE defaults to application/json.
#       e.g. local_test/predict.sh local_test/payloads/digits.csv text/csv
#   local_test/predict.sh --v2-binary [--model NAME] [CSV | NAME=CSV ...]
#       a KServe v2 request with the tensors in binary, for any model: the input names,
#       datatypes and shapes come from GET /v2/models/NAME; each CSV's rows become one
#       input's tensor (default: local_test/payloads/digits.csv for a one-input model).
#       It goes in the form SageMaker passes through: the JSON header's length travels
#       in the Content-Type, because SageMaker drops custom request headers such as
#       Inference-Header-Content-Length. The model's NAME: --model, $MODEL_NAME, else
#       the "name" in $MODEL_DIR/metadata.json (MODEL_DIR: build/model unless set).
#       local_test/v2_request.py does it; its docstring has the details.
#
# Environment: HOST (localhost) and PORT (8080: what `make run` and `make serve`
# listen on; pass the PORT you gave them). The URL it posts to goes to stderr.
# Needs curl, or for --v2-binary the system's python3: standard library only, so no
# venv. The payloads in local_test/payloads are the first three samples of
# scikit-learn's digits data set (labels 0, 1, 2).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
if [[ ${1:-} == --v2-binary ]]; then
    shift
    exec python3 "$here/v2_request.py" --url "http://${HOST:-localhost}:${PORT:-8080}" "$@"
fi

url="http://${HOST:-localhost}:${PORT:-8080}/invocations"
echo "POST $url" >&2

payload=${1:?usage: $0 PAYLOAD [CONTENT_TYPE [ACCEPT]] | --v2-binary [--model NAME] [CSV | NAME=CSV ...]}
content_type=${2:-application/json}
accept=${3:-$content_type}
# A v2 or npy answer is not text; ask for JSON then unless told otherwise.
case $accept in
    application/vnd.sagemaker-triton*|application/x-npy) [[ -z ${3:-} ]] && accept=application/json ;;
esac
status=0
curl --silent --show-error --fail-with-body --data-binary "@$payload" \
    -H "Content-Type: $content_type" -H "Accept: $accept" "$url" || status=$?
echo
exit "$status"
