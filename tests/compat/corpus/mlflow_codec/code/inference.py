# Modelled on aws-samples/amazon-sagemaker-automatic-deploy-mlflow-model
# lambdas/functions/transfer_model/sklearn/inference.py: `from sagemaker_inference
# import decoder, encoder`, whose decode and encode are the whole of input_fn and
# output_fn (a torch model here instead of the sklearn one).
import os

import torch
from sagemaker_inference import decoder, encoder


def model_fn(model_dir):
    """Deserialize and return fitted model."""
    model = torch.jit.load(os.path.join(model_dir, "model.pt"))
    return model.eval()


def input_fn(input_data, content_type):
    return decoder.decode(input_data, content_type=content_type)


def output_fn(prediction, accept):
    return encoder.encode(prediction, accept)


def predict_fn(input_data, model):
    with torch.no_grad():
        return model(torch.as_tensor(input_data, dtype=torch.float32)).numpy()
