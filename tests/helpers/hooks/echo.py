"""A JSON model: {"x": [...], "sleep": s, "fail": bool} is answered x * TIMES after sleeping
s seconds in predict_fn, or raises "asked to fail". model_fn takes LOAD_S seconds (/ping
answers 503 meanwhile)."""

import json
import time

import numpy as np

TIMES = 2
LOAD_S = 0


def model_fn(model_dir):
    time.sleep(LOAD_S)
    return "echo"


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(data, model):
    time.sleep(float(data.get("sleep", 0)))
    if data.get("fail"):
        raise RuntimeError("asked to fail")
    return np.asarray(data["x"], dtype=np.float32) * TIMES
