"""A JSON model: {"x": [...], "sleep": s, "spin": s, "until": path, "fail": bool} is answered
x * TIMES after sleeping s seconds in predict_fn (or, with "until", once that file exists: a
test holds a request for as long as it needs; with "spin", after s seconds of pure-Python
CPU, the GIL held throughout), or raises "asked to fail". model_fn takes LOAD_S seconds
(/ping answers 503 meanwhile)."""

import json
import os
import time

import numpy as np

TIMES = 2
LOAD_S = 0


def model_fn(model_dir):
    time.sleep(LOAD_S)
    return "echo"


def input_fn(body, content_type):
    return json.loads(body)


def held(data):
    gate = data.get("until")
    if gate:
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(float(data.get("sleep", 0)))
    deadline = time.process_time() + float(data.get("spin", 0))
    while time.process_time() < deadline:
        pass


def predict_fn(data, model):
    held(data)
    if data.get("fail"):
        raise RuntimeError("asked to fail")
    return np.asarray(data["x"], dtype=np.float32) * TIMES
