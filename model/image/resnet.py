"""ResNet-18 (He et al., "Deep Residual Learning for Image Recognition", 2015), in plain
torch: the layout torchvision's `resnet18` has (a 7x7 stem, four stages of two basic
blocks at 64, 128, 256 and 512 channels, global average pooling, one linear layer), so
a state_dict trained with torchvision loads into it unchanged. Written here because
PyPI's torchvision does not import beside the CPU build of torch this project pins.
"""

from __future__ import annotations

import torch
from torch import nn

STAGES = (64, 128, 256, 512)
BLOCKS_PER_STAGE = 2


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (a strided 1x1 convolution where the shape changes)."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, STAGES[0], 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(STAGES[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = STAGES[0]
        for i, planes in enumerate(STAGES):
            blocks = [BasicBlock(inplanes, planes, stride=1 if i == 0 else 2)]
            blocks += [BasicBlock(planes, planes) for _ in range(BLOCKS_PER_STAGE - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(STAGES[-1], num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
