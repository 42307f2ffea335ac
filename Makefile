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

clean:
	rm -rf build
