# Modelled on the PIL input_fn of aws/amazon-sagemaker-examples
# archived/_old-folder-structure/sagemaker_neo_compilation_jobs/
# deploy_pytorch_model_on_Inf1_instance/resnet18.py, with the image sent base64 in a
# JSON body, as the Scones Unlimited projects send theirs (beauvilerobed/
# ml-workflow-build-for-scones-unlimited lambda_function.py: base64.b64decode of the
# event's image_data): `json.loads(request_body)["image"]`, decoded, opened with PIL.
# The output_fn answers a dict of the top class and its probabilities as JSON text.
import base64
import io
import json
import os

import numpy as np
import torch
from PIL import Image


def model_fn(model_dir):
    model = torch.jit.load(os.path.join(model_dir, "traced_model.pt"), map_location=torch.device("cpu"))
    model.eval()
    return model


def input_fn(request_body, content_type="application/json"):
    if content_type == "application/json":
        image = Image.open(io.BytesIO(base64.b64decode(json.loads(request_body)["image"]))).convert("L")
        array = np.asarray(image.resize((8, 8)), dtype=np.float32) / 255.0
        return torch.from_numpy(array).reshape(1, 1, 8, 8)
    raise ValueError(f"Unsupported content type: {content_type}")


def predict_fn(input_data, model):
    with torch.no_grad():
        return torch.softmax(model(input_data), dim=1)


def output_fn(prediction, accept="application/json"):
    probabilities = prediction[0].tolist()
    return json.dumps({"class": int(np.argmax(probabilities)), "probabilities": probabilities})
