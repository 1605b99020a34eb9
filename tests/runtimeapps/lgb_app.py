"""A LightGBM model behind a plain WSGI app (``gunicorn -w 2 lgb_app:app``).

Written as a user writes it: the booster is loaded once per worker and
predicts 20,000 made-up rows per request with two OpenMP threads. Nothing
here knows of tuna_lab.
"""

import json
import os
import sys

import numpy as np

# The test venv has scikit-learn (tuna_lab's advise extra), which `import lightgbm` would import with
# scipy.stats and pandas: most of a second of CPU per worker, for wrappers this app does not use.
sys.modules.setdefault("sklearn", None)
import lightgbm as lgb  # noqa: E402

if sys.modules.get("sklearn", 0) is None:
    del sys.modules["sklearn"]

booster = lgb.Booster(model_file=os.environ["APP_MODEL"])
rows = np.random.default_rng(0).random((20000, booster.num_feature()))


def app(environ, start_response):
    body = json.dumps({"mean": float(booster.predict(rows, num_threads=2).mean())}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
