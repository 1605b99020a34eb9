"""A WSGI app for Gunicorn's threaded worker (``-k gthread --threads 4``): XGBoost called from its pool threads.

The model is ``$FIELD_MODEL`` (trained by apps/train.py), loaded at import - in
each worker, or once in the master with ``--preload`` - with ``nthread`` from
``$FIELD_NTHREAD``. POST a JSON ``{"rows": [[...], ...]}``; the answer is the
mean prediction.
"""

import json
import os

import numpy as np
import xgboost as xgb

#: Each request's rows predicted this many times over: the model, not HTTP, is the work (as in the field).
REPEAT = int(os.environ.get("FIELD_REPEAT", "40"))

booster = xgb.Booster(model_file=os.environ["FIELD_MODEL"])
booster.set_param({"nthread": int(os.environ.get("FIELD_NTHREAD", "2"))})
# One prediction at load: a team is made on the loading thread, as a real app's warm-up makes it.
booster.inplace_predict(np.zeros((8, booster.num_features()), dtype=np.float32))


def app(environ, start_response):
    size = int(environ.get("CONTENT_LENGTH") or 0)
    rows = np.asarray(json.loads(environ["wsgi.input"].read(size))["rows"], dtype=np.float32)
    body = json.dumps({"mean": float(booster.inplace_predict(np.tile(rows, (REPEAT, 1))).mean())}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
