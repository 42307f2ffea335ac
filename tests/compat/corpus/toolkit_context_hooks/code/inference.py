# Modelled on aws/sagemaker-pytorch-inference-toolkit
# test/resources/model_gpu_context/code/inference.py: every hook takes the context as
# one more, last, parameter and reads `context.system_properties["gpu_id"]`. (It
# answers what it read instead of writing it to CSV files, and runs a model.)
import json
import os

import torch


def model_fn(model_dir, context):
    model = torch.jit.load(os.path.join(model_dir, "model.pt")).eval()
    model.gpu_at_load = context.system_properties.get("gpu_id")
    return model


def input_fn(data, content_type, context):
    return torch.tensor(json.loads(data), dtype=torch.float32)


def predict_fn(data, model, context):
    with torch.no_grad():
        return model(data)


def output_fn(prediction, accept, context):
    return json.dumps({"gpu_id": context.system_properties.get("gpu_id"), "output": prediction.tolist()})
