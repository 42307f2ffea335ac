"""Inference function overrides for SageMaker PyTorch serving container
"""
# Modelled on aws-samples/aws-ml-jp sagemaker/sagemaker-inference/pytorch/code_mme/inference.py:
# the network comes from a sibling module of the script, model_fn loads its state_dict
# and returns the model as it is, in training mode, dropout and all. The toolkit's
# default predict_fn puts it in eval mode (and no_grad) before every call.
import logging
import os
import sys

import torch

from model import Net

logger = logging.getLogger(__name__)
logger.setLevel(logging.DEBUG)
logger.addHandler(logging.StreamHandler(sys.stdout))


def model_fn(model_dir):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.DataParallel(Net())
    with open(os.path.join(model_dir, "model.pth"), "rb") as f:
        model.load_state_dict(torch.load(f))
    return model.to(device)
