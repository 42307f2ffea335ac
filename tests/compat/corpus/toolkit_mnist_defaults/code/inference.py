# Modelled on aws/sagemaker-pytorch-inference-toolkit
# test/resources/mnist/model_cpu/code/mnist.py: the toolkit's own test script. Its own
# network class (with dropout) wrapped in DataParallel, a state_dict loaded in model_fn,
# and no other hook: the toolkit's default input_fn, predict_fn and output_fn serve it.
# Smaller than MNIST's (14x14 images) so that it builds in a blink.
from __future__ import absolute_import

import logging
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

logger = logging.getLogger(__name__)
logger.setLevel(logging.DEBUG)
logger.addHandler(logging.StreamHandler(sys.stdout))


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=3)
        self.conv2 = nn.Conv2d(4, 8, kernel_size=3)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(32, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 32)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def model_fn(model_dir):
    logger.info("model_fn")
    model = torch.nn.DataParallel(Net())
    with open(os.path.join(model_dir, "torch_model.pth"), "rb") as f:
        model.load_state_dict(torch.load(f))
    return model
