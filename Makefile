# The verbs a user expects. Everything runs from the project's own .venv, which
# `make install` creates from pinned requirements.
SHELL := /bin/bash
PYTHON_BOOTSTRAP ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8080
MODEL_DIR := build/model
STAMP := $(VENV)/.installed-stamp

.PHONY: install model serve test bench clean

install: $(STAMP)

$(STAMP): requirements-dev.txt container/requirements.txt
	test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# Trains the example digits classifier and packages it as SageMaker expects.
model: $(MODEL_DIR)/metadata.json

$(MODEL_DIR)/metadata.json: $(STAMP) model/digits.py model/train.py
	$(PY) -m model.train --out build

# Serves build/model on :$(PORT) through the same entrypoint the image uses.
serve: install model
	SM_MODEL_DIR=$(abspath $(MODEL_DIR)) SAGEMAKER_BIND_TO_PORT=$(PORT) $(PY) container/serve serve

test: install model
	$(PY) -m pytest

# Speed is measured here, as ratios within one run, never asserted in tests.
bench: install model
	$(PY) bench/bench_codec.py
	$(PY) bench/bench_batch.py
	$(PY) bench/bench_load.py

clean:
	rm -rf build


# ---- The image: build, run, stop ----

# docker when a Docker engine answers, podman otherwise; CONTAINER_ENGINE=... overrides.
CONTAINER_ENGINE ?= $(shell local_test/container_engine.sh)
IMAGE ?= sagemaker-pytorch-byoc:latest
# Not CONTAINER_NAME: CI systems and sandboxes often export that for themselves.
RUN_NAME ?= sagemaker-pytorch-byoc
# Empty: the Dockerfile's default (python:3.11-slim-bookworm). `make base-image` makes
# a local one for machines that cannot reach a registry; then BASE_IMAGE=$(LOCAL_BASE_IMAGE).
BASE_IMAGE ?=
LOCAL_BASE_IMAGE ?= localhost/bookworm-python:3.11
# Empty: torch from PyPI, its CUDA 13.0 build. e.g. https://download.pytorch.org/whl/cu128
# for hosts with an older NVIDIA driver, https://download.pytorch.org/whl/cpu for a
# small CPU-only image.
TORCH_INDEX_URL ?=
BUILD_ARGS ?=

.PHONY: build run stop base-image

# SageMaker takes Docker schema 2 manifests only: podman writes OCI unless given
# --format docker, and docker's default provenance attestation makes an OCI index.
build:
	$(CONTAINER_ENGINE) build -t $(IMAGE) \
		$(if $(filter podman,$(notdir $(CONTAINER_ENGINE))),--format docker) \
		$(if $(filter docker,$(notdir $(CONTAINER_ENGINE))),--provenance=false) \
		$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
		$(if $(TORCH_INDEX_URL),--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL)) \
		$(BUILD_ARGS) .

# Serves $(MODEL_DIR) from the image in the foreground, as SageMaker would
# (read-only /opt/ml/model, port 8080, `serve`); `make stop` from another shell
# sends SIGTERM and lets in-flight requests finish.
run: model
	CONTAINER_ENGINE=$(CONTAINER_ENGINE) RUN_NAME=$(RUN_NAME) PORT=$(PORT) \
		local_test/serve_local.sh $(IMAGE) $(MODEL_DIR)

stop:
	$(CONTAINER_ENGINE) stop -t 30 $(RUN_NAME)

base-image:
	CONTAINER_ENGINE=$(CONTAINER_ENGINE) scripts/make_base_image.sh $(LOCAL_BASE_IMAGE)

# ---- SageMaker deployment (python -m deploy; see README "Deploying to SageMaker") ----
# Needs AWS credentials and a region in the environment, and an execution role:
#   make push deploy ROLE=arn:aws:iam::123456789012:role/SageMakerExecution
# Each step is idempotent: rerunning one changes nothing that is already in place.
ENDPOINT ?= smserve-digits
# Empty: $(ENDPOINT)-<12 hex of the image digest>-<8 hex of the model archive's hash>.
# Models are immutable in SageMaker, so a rebuilt image or a retrained model needs a new
# model name; deriving it from both makes `make push update` roll out exactly that.
SM_MODEL_NAME ?=
INSTANCE_TYPE ?= ml.m5.xlarge
INSTANCE_COUNT ?= 1
ROLE ?= $(SAGEMAKER_ROLE_ARN)
# push writes the digest URI here, so deploy gives SageMaker exactly what was pushed.
IMAGE_URI ?= $(shell cat build/image-uri 2>/dev/null)
DEPLOY := $(PY) -m deploy

.PHONY: push deploy update sm-model invoke teardown test-deploy

push: install
	@mkdir -p build
	$(DEPLOY) push $(IMAGE) > build/image-uri.tmp && mv build/image-uri.tmp build/image-uri
	@cat build/image-uri

# The model data and the SageMaker model: writes build/model-uri and build/sm-model-name.
sm-model: install model
	@test -n "$(IMAGE_URI)" || { echo "no image URI: run 'make push' first or pass IMAGE_URI=repo@sha256:..." >&2; exit 1; }
	@mkdir -p build
	$(DEPLOY) package $(MODEL_DIR) --create-bucket > build/model-uri
	@image='$(IMAGE_URI)'; data=$$(cat build/model-uri); data=$${data%/model.tar.gz}; data=$${data##*/}; \
		case "$$image" in *@sha256:*) digest=$${image##*@sha256:};; *) digest=$$(printf %s "$$image" | sha256sum);; esac; \
		name='$(SM_MODEL_NAME)'; test -n "$$name" || name=$$(printf %s '$(ENDPOINT)' | cut -c1-40)-$${digest:0:12}-$${data:0:8}; \
		echo "$$name" > build/sm-model-name
	$(DEPLOY) create-model --model-name $$(cat build/sm-model-name) --image $(IMAGE_URI) --model-data $$(cat build/model-uri) $(if $(ROLE),--role $(ROLE))

# First deployment: a new endpoint. Once it exists, `make update` rolls out a new image or model.
deploy: sm-model
	$(DEPLOY) create-endpoint --endpoint-name $(ENDPOINT) --model-name $$(cat build/sm-model-name) \
		--instance-type $(INSTANCE_TYPE) --instance-count $(INSTANCE_COUNT)

# Switches the existing endpoint to the model of the current image and archive; its
# autoscaling is kept. Older models and configs stay until `make teardown`.
update: sm-model
	$(DEPLOY) update-endpoint --endpoint-name $(ENDPOINT) --model-name $$(cat build/sm-model-name) \
		--instance-type $(INSTANCE_TYPE) --instance-count $(INSTANCE_COUNT)

# Four digits from scikit-learn's set, sent in the binary v2 form; prints the probabilities.
invoke: install
	@mkdir -p build
	$(PY) -c "import numpy as np; from sklearn.datasets import load_digits; np.save('build/digits-sample.npy', load_digits().data[:4].astype('float32'))"
	$(DEPLOY) invoke --endpoint-name $(ENDPOINT) --array build/digits-sample.npy \
		--content-type application/vnd.sagemaker-triton.binary+json --input-name pixels

teardown: install
	$(DEPLOY) teardown --endpoint-name $(ENDPOINT)

# The deploy tool against a local moto server (no AWS account needed).
test-deploy: install
	$(PY) -m pytest tests/deploy
