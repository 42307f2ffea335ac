"""{"n": k, "pause": s, "fail_at": i, "id": name}: yields k records s seconds apart (a response
stream). With TEST_STREAM_MARKS set, it writes TEST_STREAM_MARKS/closed-<id> when its generator is
closed, finished or not, so a test sees what happened to it."""

import json
import os
import time

MARKS = os.environ.get("TEST_STREAM_MARKS")


def model_fn(model_dir):
    return "words"


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(data, model):
    try:
        for i in range(int(data["n"])):
            if i == data.get("fail_at"):
                raise RuntimeError("broke at %d" % i)
            yield {"token": i, "text": "w%d" % i}
            time.sleep(float(data.get("pause", 0)))
    finally:
        if MARKS:
            with open(os.path.join(MARKS, "closed-%s" % data.get("id", "x")), "w") as f:
                f.write("closed")
