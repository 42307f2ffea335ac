# Modelled on calvinfeng/deploy-a-sentiment-analysis-model serve/predict.py (Udacity's
# SageMaker deployment project): model_info and a word_dict saved beside the weights,
# an LSTM from a sibling module, a text/plain body decoded in input_fn, a predict_fn
# that tokenizes, pads and returns one number, and an output_fn that returns str().
# (The vocabulary is JSON here, built by make_model.py, instead of a pickle.)
import json
import os
import re

import numpy as np
import torch

from model import LSTMClassifier


def review_to_words(review):
    return re.findall(r"[a-z0-9]+", review.lower())


def convert_and_pad(word_dict, sentence, pad=20):
    NOWORD, INFREQ = 0, 1
    working = [NOWORD] * pad
    for index, word in enumerate(sentence[:pad]):
        working[index] = word_dict.get(word, INFREQ)
    return working, min(len(sentence), pad)


def model_fn(model_dir):
    print("Loading model.")
    with open(os.path.join(model_dir, "model_info.json")) as f:
        model_info = json.load(f)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = LSTMClassifier(model_info["embedding_dim"], model_info["hidden_dim"], model_info["vocab_size"])
    with open(os.path.join(model_dir, "model.pth"), "rb") as f:
        model.load_state_dict(torch.load(f))
    with open(os.path.join(model_dir, "word_dict.json")) as f:
        model.word_dict = json.load(f)
    model.to(device).eval()
    print("Done loading model.")
    return model


def input_fn(serialized_input_data, content_type):
    print("Deserializing the input data.")
    if content_type == "text/plain":
        data = serialized_input_data.decode("utf-8")
        return data
    raise Exception("Requested unsupported ContentType in content_type: " + content_type)


def output_fn(prediction_output, accept):
    print("Serializing the generated output.")
    return str(prediction_output)


def predict_fn(input_data, model):
    print("Inferring sentiment of input data.")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data_X, data_len = convert_and_pad(model.word_dict, review_to_words(input_data))
    data_pack = np.hstack((data_len, data_X)).reshape(1, -1)
    data = torch.from_numpy(data_pack).long().to(device)
    model.eval()
    with torch.no_grad():
        output = model(data)
    result = int(np.round(output.item()))
    return result
