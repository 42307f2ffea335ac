# The verbs a user expects; `make help` lists them. Everything runs from the project's
# own .venv, which `make install` creates from the lock (lock/README.md).
# Every target line carries a `## one-line description`: `make help` prints those, and
# tests/unit/test_makefile.py checks that no target goes without one.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON_BOOTSTRAP ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

# What `make serve` serves, and where. Your environment wins over the defaults: SageMaker's
# own variables (SM_MODEL_DIR=... make serve) as well as these (make serve MODEL_DIR=...).
EXAMPLE_MODEL_DIR := build/model
MODEL_DIR ?= $(or $(SM_MODEL_DIR),$(EXAMPLE_MODEL_DIR))
PORT ?= $(or $(SAGEMAKER_BIND_TO_PORT),8080)
# The example is trained only when it is the model being served: a folder of yours
# (with or without metadata.json) never triggers training.
MODEL_DEPS = $(if $(filter $(abspath $(EXAMPLE_MODEL_DIR)),$(abspath $(MODEL_DIR))),model)
# Which of the two set MODEL_DIR, so that a message names the one to fix.
MODEL_DIR_SETTING = $(if $(and $(filter file,$(origin MODEL_DIR)),$(SM_MODEL_DIR)),SM_MODEL_DIR,MODEL_DIR)

# torch: the one pin is in requirements-dev.txt. TORCH_VARIANT=cpu takes its CPU build
# (2.13.0+cpu: no CUDA libraries, under 200 MB), the default where nvidia-smi is
# missing; cuda takes PyPI's torch (the CUDA 13 build, several GB with its nvidia-*
# wheels). The CPU wheel comes from pip's find-links when a local copy is there, so
# nothing waits on an index it does not need; else from TORCH_CPU_INDEX_URL. pip's own
# configuration finds it (a dry run), and uv installs it from that folder when it is a
# local one: 6 s where pip takes 13.
TORCH_VERSION := $(shell sed -n 's/^torch==//p' requirements-dev.txt)
TORCH_VARIANT ?= $(if $(shell command -v nvidia-smi 2>/dev/null),cuda,cpu)
TORCH_CPU_INDEX_URL ?= https://download.pytorch.org/whl/cpu
LOCK := lock/dev$(if $(filter cpu,$(TORCH_VARIANT)),-no-torch).txt
STAMP := $(VENV)/.installed-$(TORCH_VARIANT)
UV := $(VENV)/bin/uv

.PHONY: help install lock lint model model-textgen model-image new-model compat-check serve test test-fast batch-example mme-local bench clean

help: ## This list (variables: docs/reference.md "Make targets and variables")
	@awk -F':[^#]*## ' '/^[a-zA-Z][a-zA-Z0-9_-]*:[^=].*## /{printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: $(STAMP) ## The .venv from the lock (TORCH_VARIANT=cpu|cuda; VENV=path)

# Every package pinned and hashed (--require-hashes, --no-deps: the lock is complete);
# torch's CPU build is not on PyPI, so it is pinned by version, not hash (lock/README.md).
# pip installs uv (lock/uv.txt), and uv the rest: it takes seconds where pip takes a minute.
# --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, a module without
# its .pyc is compiled again by every process that imports it.
$(STAMP): $(LOCK) lock/uv.txt
	test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --require-hashes --no-deps -r lock/uv.txt
	$(UV) pip install --python $(PY) --require-hashes --no-deps --compile-bytecode -r $(LOCK)
ifeq ($(TORCH_VARIANT),cpu)
	folder=$$($(PY) -m pip install --dry-run --quiet --no-deps --no-index --ignore-installed --report - \
			"torch==$(TORCH_VERSION)+cpu" 2>/dev/null | $(PY) scripts/local_wheel_folder.py) \
		&& $(UV) pip install --python $(PY) --no-deps --no-index --compile-bytecode --find-links "$$folder" "torch==$(TORCH_VERSION)+cpu" \
		|| $(PY) -m pip install --no-deps --no-index "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
		|| $(PY) -m pip install --no-deps --index-url $(TORCH_CPU_INDEX_URL) "torch==$(TORCH_VERSION)+cpu"
endif
	$(PY) -m pip check
	rm -f $(VENV)/.installed-*
	touch $@

lock: install ## Regenerate lock/*.txt after editing requirements-dev.txt or container/requirements.txt
	UV=$(UV) lock/compile.sh

model: $(EXAMPLE_MODEL_DIR)/metadata.json ## Train the example digits classifier into build/model (and build/model.tar.gz)

$(EXAMPLE_MODEL_DIR)/metadata.json: $(STAMP) model/digits.py model/train.py
	$(PY) -m model.train --out build

TEXTGEN_MODEL_DIR := build/textgen

model-textgen: $(TEXTGEN_MODEL_DIR)/config.json ## Train the streaming example (a character GRU) into build/textgen (+ .tar.gz)

$(TEXTGEN_MODEL_DIR)/config.json: $(STAMP) model/textgen/train.py model/textgen/inference.py
	$(PY) -m model.textgen.train --out build

IMAGE_MODEL_DIR := build/image

model-image: $(IMAGE_MODEL_DIR)/metadata.json ## Build the image example (ResNet-18, random weights; JPEG in through input_fn) into build/image (+ .tar.gz)

$(IMAGE_MODEL_DIR)/metadata.json: $(STAMP) model/image/build.py model/image/resnet.py model/image/inference.py
	$(PY) -m model.image.build --out build

new-model: install ## metadata.json + code/inference.py for the model.pt2/model.pt in DIR (make new-model DIR=...)
	@test -n "$(DIR)" || { echo "usage: make new-model DIR=folder-holding-model.pt2-or-model.pt" >&2; exit 2; }
	$(PY) -m model.init $(DIR)

# Serves MODEL twice, by the AWS toolkit's own handler (as the PyTorch containers do) and
# by this server, and compares their answers to each file in REQUESTS (docs/migrating.md).
# COMPAT_ARGS passes more: --concurrency N, --repeat K, --env K=V (this server only), --logs DIR.
compat-check: install ## Your model's answers from AWS's toolkit and from this server, side by side (MODEL=model.tar.gz-or-folder REQUESTS=folder)
	@test -n "$(MODEL)" && test -n "$(REQUESTS)" || { echo "usage: make compat-check MODEL=model.tar.gz-or-folder REQUESTS=folder [COMPAT_ARGS='--concurrency 8']" >&2; exit 2; }
	$(PY) -m local_test.compat_check $(MODEL) $(REQUESTS) $(COMPAT_ARGS)

# A model that fails to load stops the server here (SMSERVE_EXIT_ON_LOAD_ERROR): locally
# the error is the news, while under SageMaker the container stays up and /ping says 500.
# In multi-model mode POST /models loads folders under this checkout (build/model,
# make mme-local's build/mme-cache), where SageMaker's are under /opt/ml/models.
serve: install $(MODEL_DEPS) ## Serve MODEL_DIR (default build/model) on PORT (8080) with the image's entrypoint
	@test -d "$(MODEL_DIR)" || { echo "make serve: $(MODEL_DIR_SETTING)=$(MODEL_DIR) is not a folder: give the one holding your model.pt2 or model.pt (make serve MODEL_DIR=my-model)" >&2; exit 2; }
	SM_MODEL_DIR=$(abspath $(MODEL_DIR)) SAGEMAKER_BIND_TO_PORT=$(PORT) SMSERVE_EXIT_ON_LOAD_ERROR=$(or $(SMSERVE_EXIT_ON_LOAD_ERROR),true) SMSERVE_MODELS_ROOT=$(or $(SMSERVE_MODELS_ROOT),$(CURDIR)) $(PY) container/serve serve

# The tests on PYTEST_WORKERS processes (pytest-xdist; a free process takes the next
# module, whole: a module's shared servers then start once, not once a process), and
# last the `serial` ones, alone on one process, since they time the server
# (tests/helpers/scheduling.py).
PYTEST_WORKERS ?= 3
PYTEST_ARGS ?=
# The tests' processes (servers, workers, hook processes: hundreds) write this checkout's
# compiled modules beside them (__pycache__, ignored by git and the image), even where
# PYTHONDONTWRITEBYTECODE is set: each would otherwise compile them again, and pytest
# rewrite every test module. The venv's are compiled by make install, and read as they
# are (a PYTHONPYCACHEPREFIX would compile them all again, once in each process at first).
TEST_ENV = PYTHONDONTWRITEBYTECODE=
define run_tests
	$(TEST_ENV) $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope $(1) $(PYTEST_ARGS)
endef

lint: install ## ruff over the repository (ruff.toml); make test runs it first
	$(PY) -m ruff check .

test: install lint model model-textgen ## Every test: lint, unit, integration, deploy (moto) and container (the image)
	$(call run_tests,)

test-fast: install lint model model-textgen ## Every test but the image's (tests/container): the inner loop
	$(call run_tests,--ignore=tests/container)

batch-example: install model ## A local batch transform of the example: build/batch-example/in -> out
	$(PY) -m local_test.batch_example

# SageMaker's part of a multi-model endpoint against a server already running in that mode
# (SAGEMAKER_MULTI_MODEL=true make serve, in another shell): unpack MME_MODELS/TARGET,
# load it (unloading the least recently used model on 507), invoke it with BODY.
MME_MODELS ?= build
TARGET ?= model.tar.gz
BODY ?= local_test/payloads/digits.json
CONTENT_TYPE ?= application/json
ACCEPT ?=
MME_URL ?= http://127.0.0.1:$(PORT)

mme-local: install $(if $(filter build,$(MME_MODELS)),model) ## Invoke TARGET from the archives in MME_MODELS on a multi-model server at MME_URL
	$(PY) -m local_test.multi_model $(MME_MODELS) --target $(TARGET) --url $(MME_URL) --body $(BODY) \
		--content-type $(CONTENT_TYPE) $(if $(ACCEPT),--accept $(ACCEPT))

# Speed is measured here, as ratios within one run, never asserted in tests.
bench: install model ## Codec, batch-transform and load benchmarks (load needs `hey`)
	$(PY) bench/bench_codec.py
	$(PY) bench/bench_batch.py
	$(PY) bench/bench_load.py

clean: ## Remove build/ (the example model, image URIs, batch example)
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
# A folder holding the torch wheel (torch-$(TORCH_VERSION)+cpu-cp311-*.whl, or the plain
# version's), mounted into the build so that torch is not downloaded (podman only:
# docker build mounts no folders). torch's small dependencies still come from the index.
TORCH_WHEEL_DIR ?=
TORCH_WHEEL_PATH = $(abspath $(TORCH_WHEEL_DIR))
TORCH_WHEEL_VERSION = $(TORCH_VERSION)$(if $(wildcard $(TORCH_WHEEL_PATH)/torch-$(TORCH_VERSION)+cpu-cp311-*.whl),+cpu)
# true: g++ and Python's headers in the image, so that SMSERVE_COMPILE (torch.compile)
# can compile (about 300 MB more). Empty: the Dockerfile's default, none.
COMPILER ?=
BUILD_ARGS ?=

.PHONY: build run stop base-image

# SageMaker takes Docker schema 2 manifests only: podman writes OCI unless given
# --format docker, and docker's default provenance attestation makes an OCI index.
# A failed build ends with where to turn: most often the base image could not be pulled.
build: ## The image (CONTAINER_ENGINE, IMAGE, BASE_IMAGE, TORCH_INDEX_URL, TORCH_WHEEL_DIR, COMPILER, BUILD_ARGS)
ifneq ($(TORCH_WHEEL_DIR),)
	@test -n "$(filter podman,$(notdir $(CONTAINER_ENGINE)))" || { echo "make build: TORCH_WHEEL_DIR needs podman (CONTAINER_ENGINE=podman): docker build cannot mount a folder into the build" >&2; exit 2; }
	@test -n "$(wildcard $(TORCH_WHEEL_PATH)/torch-$(TORCH_VERSION)*-cp311-*.whl)" || { echo "make build: TORCH_WHEEL_DIR=$(TORCH_WHEEL_DIR) holds no torch-$(TORCH_VERSION) wheel for Python 3.11 (torch-$(TORCH_VERSION)+cpu-cp311-*.whl or torch-$(TORCH_VERSION)-cp311-*.whl)" >&2; exit 2; }
endif
	$(CONTAINER_ENGINE) build -t $(IMAGE) \
		$(if $(filter podman,$(notdir $(CONTAINER_ENGINE))),--format docker) \
		$(if $(filter docker,$(notdir $(CONTAINER_ENGINE))),--provenance=false) \
		$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
		$(if $(TORCH_INDEX_URL),--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL)) \
		$(if $(COMPILER),--build-arg COMPILER=$(COMPILER)) \
		$(if $(TORCH_WHEEL_DIR),--build-arg TORCH_FIND_LINKS=$(TORCH_WHEEL_PATH) --volume $(TORCH_WHEEL_PATH):$(TORCH_WHEEL_PATH):ro) \
		--build-arg TORCH_VERSION=$(if $(TORCH_WHEEL_DIR),$(TORCH_WHEEL_VERSION),$(TORCH_VERSION)) \
		$(BUILD_ARGS) . \
	|| { status=$$?; echo "make build: the build failed (above). $(BUILD_HINT) docs/container.md: Building offline or behind a proxy" >&2; exit $$status; }

ifeq ($(BASE_IMAGE),$(LOCAL_BASE_IMAGE))
BUILD_HINT = If $(LOCAL_BASE_IMAGE) was not found: 'make base-image' makes it (debootstrap, root, a Debian mirror).
else
BUILD_HINT = If it stopped at the base image, $(or $(BASE_IMAGE),python:3.11-slim-bookworm), because its registry is \
	out of reach (Docker Hub, a proxy): 'make base-image' makes one locally (debootstrap, root, a Debian mirror), \
	then 'make build BASE_IMAGE=$(LOCAL_BASE_IMAGE)'.
endif

# Serves $(MODEL_DIR) from the image in the foreground, as SageMaker would
# (read-only /opt/ml/model, port 8080, `serve`); `make stop` from another shell
# sends SIGTERM and lets in-flight requests finish.
run: $(MODEL_DEPS) ## Serve MODEL_DIR from the image on PORT, as SageMaker would (foreground)
	CONTAINER_ENGINE=$(CONTAINER_ENGINE) RUN_NAME=$(RUN_NAME) PORT=$(PORT) \
		local_test/serve_local.sh $(IMAGE) $(abspath $(MODEL_DIR))

stop: ## SIGTERM the container `make run` started; requests in flight finish
	$(CONTAINER_ENGINE) stop -t 30 $(RUN_NAME)

base-image: ## A local Debian + Python 3.11 base image, for machines without a registry
	CONTAINER_ENGINE=$(CONTAINER_ENGINE) scripts/make_base_image.sh $(LOCAL_BASE_IMAGE)

# ---- SageMaker deployment (python -m deploy; see docs/deploy.md) ----
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

push: install ## Push IMAGE to ECR; writes build/image-uri (repo@sha256:...)
	@mkdir -p build
	$(DEPLOY) push $(IMAGE) --output build/image-uri

# The model data and the SageMaker model: writes build/model-uri and build/sm-model-name.
sm-model: install $(MODEL_DEPS) ## Package MODEL_DIR to S3 and create the SageMaker model
	@test -n "$(IMAGE_URI)" || { echo "no image URI: run 'make push' first or pass IMAGE_URI=repo@sha256:..." >&2; exit 1; }
	@mkdir -p build
	$(DEPLOY) package $(MODEL_DIR) --create-bucket > build/model-uri.tmp && mv build/model-uri.tmp build/model-uri
	@image='$(IMAGE_URI)'; data=$$(cat build/model-uri); data=$${data%/model.tar.gz}; data=$${data##*/}; \
		case "$$image" in *@sha256:*) digest=$${image##*@sha256:};; *) digest=$$(printf %s "$$image" | sha256sum);; esac; \
		name='$(SM_MODEL_NAME)'; test -n "$$name" || name=$$(printf %s '$(ENDPOINT)' | cut -c1-40)-$${digest:0:12}-$${data:0:8}; \
		echo "$$name" > build/sm-model-name
	$(DEPLOY) create-model --model-name $$(cat build/sm-model-name) --image $(IMAGE_URI) --model-data $$(cat build/model-uri) $(if $(ROLE),--role $(ROLE))

# First deployment: a new endpoint. Once it exists, `make update` rolls out a new image or model.
deploy: sm-model ## First deployment: a new endpoint (ROLE=..., ENDPOINT, INSTANCE_TYPE)
	$(DEPLOY) create-endpoint --endpoint-name $(ENDPOINT) --model-name $$(cat build/sm-model-name) \
		--instance-type $(INSTANCE_TYPE) --instance-count $(INSTANCE_COUNT)

# Switches the existing endpoint to the model of the current image and archive; its
# autoscaling is kept. Older models and configs stay until `make teardown`.
update: sm-model ## Switch the endpoint to the current image and model
	$(DEPLOY) update-endpoint --endpoint-name $(ENDPOINT) --model-name $$(cat build/sm-model-name) \
		--instance-type $(INSTANCE_TYPE) --instance-count $(INSTANCE_COUNT)

# Four digits from scikit-learn's set, sent in the binary v2 form; prints the probabilities.
invoke: install ## Four digits to the endpoint, binary KServe v2
	@mkdir -p build
	$(PY) -c "import numpy as np; from sklearn.datasets import load_digits; np.save('build/digits-sample.npy', load_digits().data[:4].astype('float32'))"
	$(DEPLOY) invoke --endpoint-name $(ENDPOINT) --array build/digits-sample.npy \
		--content-type application/vnd.sagemaker-triton.binary+json --input-name pixels

teardown: install ## Delete the endpoint, its configs and models
	$(DEPLOY) teardown --endpoint-name $(ENDPOINT)

# The deploy tool against a local moto server (no AWS account needed).
test-deploy: install ## The deploy tool's tests against a local moto server
	$(PY) -m pytest tests/deploy
