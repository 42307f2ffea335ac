# Modelled on buddhadeb33/notes `b` (its inference.py): input_fn reads the request's
# "instances", predict_fn answers `.tolist()`, and output_fn returns a dict,
# {"predictions": ...}, which the model server serializes. (json.loads added: the
# original indexes the body itself; a torch model stands in for the joblib one.)
import json
import os

import numpy as np
import torch


def model_fn(model_dir):
    model = torch.jit.load(os.path.join(model_dir, "model.pt"))
    return model.eval()


def input_fn(request_body, content_type="application/json"):
    if content_type == "application/json":
        return np.array(json.loads(request_body)["instances"], dtype=np.float32)
    else:
        raise ValueError(f"Unsupported content type: {content_type}")


def predict_fn(input_data, model):
    with torch.no_grad():
        return model(torch.from_numpy(input_data)).tolist()


def output_fn(prediction, content_type="application/json"):
    return {"predictions": prediction}
