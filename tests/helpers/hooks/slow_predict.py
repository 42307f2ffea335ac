"""For a copy of the example model: predict_fn sleeps SECONDS, then runs the model, so
requests stay in flight long enough to act in the middle of them."""

import time

import torch

SECONDS = 1


def predict_fn(data, model):
    time.sleep(SECONDS)
    with torch.inference_mode():
        return model(data)
