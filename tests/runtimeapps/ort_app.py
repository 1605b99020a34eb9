"""An ONNX Runtime model behind a plain ASGI app (``uvicorn ort_app:app --workers 2``).

Written as a user writes it: the session is made once per worker with two
intra-op threads (ONNX Runtime's own pool, not OpenMP), and each request runs
the model on a batch of 256 rows. Nothing here knows of tuna_lab.
"""

import json
import os

import numpy as np
import onnxruntime as ort

options = ort.SessionOptions()
options.intra_op_num_threads = int(os.environ.get("APP_THREADS", "2"))
session = ort.InferenceSession(os.environ["APP_MODEL"], options, providers=["CPUExecutionProvider"])
batch = np.random.default_rng(0).standard_normal((256, session.get_inputs()[0].shape[1])).astype(np.float32)


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body"):
        pass                                       # the body, if any, is not used: the batch is fixed
    (out,) = session.run(None, {session.get_inputs()[0].name: batch})
    body = json.dumps({"mean": float(out.mean())}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
