# Modelled on the predict_fn of calvinfeng/deploy-a-sentiment-analysis-model
# serve/predict.py, which returns one number, here with no output_fn: the toolkit's
# default output_fn encodes that number as the answer. input_fn reads JSON with
# `json.loads(request_body)`.
import json
import os

import torch


def model_fn(model_dir):
    return torch.jit.load(os.path.join(model_dir, "model.pt")).eval()


def input_fn(request_body, request_content_type):
    return torch.tensor(json.loads(request_body)["features"], dtype=torch.float32)


def predict_fn(data, model):
    with torch.no_grad():
        return model(data.unsqueeze(0)).item()
