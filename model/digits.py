"""The example model: a small classifier of scikit-learn's 8x8 handwritten digits.

Input: 64 pixel intensities (0..16, the data set's scale) per image.
Output: the probability of each digit 0..9.
"""

import torch
from torch import nn

N_PIXELS = 64
N_CLASSES = 10
PIXEL_MAX = 16.0


class DigitsClassifier(nn.Module):
    def __init__(self, hidden: int = 128):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(N_PIXELS, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, N_CLASSES),
        )

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        # Scaling lives in the model so clients send the data set's raw values.
        return self.layers(pixels / PIXEL_MAX)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(pixels), dim=-1)
