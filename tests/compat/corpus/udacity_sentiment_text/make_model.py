"""A tiny vocabulary built here (no downloads), model_info.json and seeded LSTM weights."""
import json

import torch

from tests.compat.corpus import load_script

# The script is predict.py, as the SDK's entry_point="predict.py" names it.
ENV = {"SAGEMAKER_PROGRAM": "predict.py"}
WORDS = "the movie was great good bad boring plot acting loved hated film story fun dull".split()


def build(model_dir, requests_dir):
    torch.manual_seed(8)  # a seed whose two reviews get different answers
    word_dict = {word: index + 2 for index, word in enumerate(WORDS)}  # 0: no word, 1: unknown
    info = {"embedding_dim": 8, "hidden_dim": 6, "vocab_size": len(word_dict) + 2}
    (model_dir / "word_dict.json").write_text(json.dumps(word_dict))
    (model_dir / "model_info.json").write_text(json.dumps(info))
    classifier = load_script(model_dir, "model.py").LSTMClassifier
    model = classifier(info["embedding_dim"], info["hidden_dim"], info["vocab_size"])
    torch.save(model.state_dict(), model_dir / "model.pth")
