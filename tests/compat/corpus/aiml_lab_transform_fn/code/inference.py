# Modelled on brightsparc/aiml-lab lab3/predict.py: a transform_fn(model, request_body,
# request_content_type, accept_type) doing it all, once per request, on an .npy body,
# and refusing any Accept but JSON. (A torch model stands in for its MXNet module; the
# answer is returned with its content type, as a (body, content type) tuple.)
import io
import json
import logging
import os

import numpy as np
import torch


def model_fn(model_dir):
    return torch.jit.load(os.path.join(model_dir, "model.pt")).eval()


def neo_preprocess(payload, content_type):
    logging.info("Invoking user-defined pre-processing function")
    if content_type == "application/x-npy":
        f = io.BytesIO(payload)
        return np.load(f)
    raise RuntimeError("Content type must be application/x-npy")


def transform_fn(model, request_body, request_content_type, accept_type):
    array = neo_preprocess(request_body, request_content_type)
    with torch.no_grad():
        output = model(torch.from_numpy(array)).numpy()
    if accept_type == "application/json":
        return json.dumps({"scores": output.tolist()}), accept_type
    raise RuntimeError("Accept header must be application/json")
