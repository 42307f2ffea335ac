"""PyTriton: Triton's C++ HTTP front end, the model in Python behind its default dynamic
batcher, spoken to in KServe v2 binary.

    PEER_MODEL_DIR=DIR PYTRITON_PYTHON bench/peers/pytriton_app.py HTTP_PORT GRPC_PORT METRICS_PORT
"""

import os
import sys

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

torch.set_num_threads(1)
model = torch.jit.load(os.path.join(os.environ["PEER_MODEL_DIR"], "model.pt")).eval()


@batch
def infer(x):
    with torch.no_grad():
        return {"y": model(torch.from_numpy(x)).numpy()}


http_port, grpc_port, metrics_port = (int(p) for p in sys.argv[1:4])
config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                      http_address="127.0.0.1", grpc_address="127.0.0.1")
with Triton(config=config) as triton:
    triton.bind(model_name="mlp", infer_func=infer,
                inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
                config=ModelConfig(max_batch_size=256, batcher=DynamicBatcher()))
    triton.serve()
