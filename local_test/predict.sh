#!/usr/bin/env bash
# Sends one request to a locally served model (local_test/serve_local.sh or `make run`)
# and prints the response.
#
#   local_test/predict.sh PAYLOAD [CONTENT_TYPE [ACCEPT]]
#       posts the file as is; CONTENT_TYPE defaults to application/json.
#       e.g. local_test/predict.sh local_test/payloads/digits.csv text/csv
#   local_test/predict.sh --v2-binary [CSV]
#       turns the CSV rows (default local_test/payloads/digits.csv) into a KServe v2
#       request with the tensor in binary, in the form SageMaker passes through: the
#       JSON header's length travels in the Content-Type, because SageMaker drops
#       custom request headers such as Inference-Header-Content-Length.
#
# Environment: HOST (localhost) and PORT (8080: what `make run` and `make serve`
# listen on; pass the PORT you gave them). The URL it posts to goes to stderr.
# Needs curl, and for --v2-binary the system's python3: standard library only, so no
# venv. The payloads in local_test/payloads are the first three samples of
# scikit-learn's digits data set (labels 0, 1, 2).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
url="http://${HOST:-localhost}:${PORT:-8080}/invocations"
echo "POST $url" >&2

if [[ ${1:-} == --v2-binary ]]; then
    csv=${2:-$here/payloads/digits.csv}
    body=$(mktemp)
    trap 'rm -f "$body"' EXIT
    # Standard library only: a JSON header naming the input and its byte size, then
    # the float32 values little-endian, row-major. The output is asked for as JSON so
    # that the answer prints readably; "binary_data": true would return it raw.
    header_size=$(python3 - "$csv" "$body" <<'PY'
import csv, json, struct, sys

rows = [[float(v) for v in row] for row in csv.reader(open(sys.argv[1])) if row]
blob = struct.pack(f"<{len(rows) * len(rows[0])}f", *(v for row in rows for v in row))
header = json.dumps({
    "inputs": [{"name": "pixels", "shape": [len(rows), len(rows[0])], "datatype": "FP32",
                "parameters": {"binary_data_size": len(blob)}}],
    "outputs": [{"name": "probabilities", "parameters": {"binary_data": False}}],
}, separators=(",", ":")).encode()
with open(sys.argv[2], "wb") as out:
    out.write(header + blob)
print(len(header))
PY
)
    content_type="application/vnd.sagemaker-triton.binary+json;json-header-size=$header_size"
    status=0
    curl --silent --show-error --fail-with-body --data-binary "@$body" \
        -H "Content-Type: $content_type" "$url" || status=$?
    echo
    exit "$status"
fi

payload=${1:?usage: $0 PAYLOAD [CONTENT_TYPE [ACCEPT]] | --v2-binary [CSV]}
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
