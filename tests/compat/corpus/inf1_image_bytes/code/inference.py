# Modelled on aws/amazon-sagemaker-examples archived/_old-folder-structure/
# sagemaker_neo_compilation_jobs/deploy_pytorch_model_on_Inf1_instance/resnet18.py: the
# image's own bytes as the body, opened with PIL in input_fn, resized, center-cropped
# and normalized with ImageNet's mean and std; the toolkit's default predict_fn and
# output_fn do the rest. (torchvision's transforms written with numpy, as the CPU venv
# has no torchvision; a TorchScript net stands in for ResNet-18.)
import os

import torch


def model_fn(model_dir):
    return torch.jit.load(os.path.join(model_dir, "model.pt"))


def input_fn(request_body, request_content_type):
    import io

    import numpy as np
    import torch
    from PIL import Image

    f = io.BytesIO(request_body)
    input_image = Image.open(f).convert("RGB")
    input_image = input_image.resize((18, 18), Image.BILINEAR)
    left = (18 - 16) // 2
    input_image = input_image.crop((left, left, left + 16, left + 16))
    array = np.asarray(input_image, dtype=np.float32) / 255.0
    array = (array - np.array([0.485, 0.456, 0.406], dtype=np.float32)) / np.array([0.229, 0.224, 0.225], dtype=np.float32)
    input_tensor = torch.from_numpy(array.transpose(2, 0, 1).copy())
    input_batch = input_tensor.unsqueeze(0)
    return input_batch
