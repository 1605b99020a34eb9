"""A LightGBM model behind a plain WSGI app (``gunicorn -w 2 lgb_app:app``).

Written as a user writes it: the booster is loaded once per worker and
predicts 20,000 made-up rows per request with two OpenMP threads. Nothing
here knows of tuna_lab.
"""

import json
import os

import lightgbm as lgb
import numpy as np

booster = lgb.Booster(model_file=os.environ["APP_MODEL"])
rows = np.random.default_rng(0).random((20000, booster.num_feature()))


def app(environ, start_response):
    body = json.dumps({"mean": float(booster.predict(rows, num_threads=2).mean())}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
