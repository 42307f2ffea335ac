"""The bare peer: a Flask app under gunicorn's stock gevent worker, np.load -> the model
-> np.save, no checks, no batching; what a plain Python WSGI stack costs.

    PEER_MODEL_DIR=DIR gunicorn -k gevent -w 1 -b 127.0.0.1:PORT --chdir bench/peers flask_app:app
"""

import io
import os

import numpy as np
import torch
from flask import Flask, Response, request

torch.set_num_threads(1)
model = torch.jit.load(os.path.join(os.environ["PEER_MODEL_DIR"], "model.pt")).eval()
app = Flask(__name__)


@app.get("/ping")
def ping():
    return ""


@app.post("/invocations")
def invocations():
    x = np.load(io.BytesIO(request.get_data()), allow_pickle=False)
    with torch.no_grad():
        y = model(torch.from_numpy(x)).numpy()
    out = io.BytesIO()
    np.save(out, y)
    return Response(out.getvalue(), mimetype="application/x-npy")
