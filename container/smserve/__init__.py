"""A SageMaker bring-your-own-container model server for PyTorch models."""

__version__ = "0.1.0"
