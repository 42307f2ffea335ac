# Modelled on the CSV handling of kkhatua98/SageMaker_Inference
# Endpoint/Tensorflow/inference.py (`[float(x) for x in ....split(',')]`), written
# as users of the PyTorch containers write it: the CSV body is a str there, so
# `request_body.splitlines()` and `line.split(",")` read it; the answer is CSV text.
import os

import torch


def model_fn(model_dir):
    return torch.jit.load(os.path.join(model_dir, "model.pt")).eval()


def input_fn(request_body, request_content_type):
    if request_content_type == "text/csv":
        rows = [[float(x) for x in line.split(",")] for line in request_body.splitlines() if line]
        return torch.tensor(rows)
    raise ValueError("{{\"error\": \"unsupported content type {}\"}}".format(request_content_type or "unknown"))


def predict_fn(data, model):
    with torch.no_grad():
        return model(data)


def output_fn(prediction, accept):
    return "\n".join(",".join(f"{v:.6f}" for v in row) for row in prediction.tolist())
