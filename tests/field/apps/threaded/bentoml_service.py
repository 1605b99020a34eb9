"""A BentoML service with a sync API, which BentoML runs on its thread pool: ``bentoml serve bentoml_service:Model``.

2 worker processes (``workers=2``), 4 threads each (``threads=4``); the model is
``$FIELD_MODEL`` with ``nthread`` from ``$FIELD_NTHREAD``, loaded on each
worker's main thread (whose libgomp team then idles) and called from the pool.
"""

import os

import bentoml
import numpy as np
import xgboost as xgb

#: Each request's rows predicted this many times over: the model, not HTTP, is the work (as in the field).
REPEAT = int(os.environ.get("FIELD_REPEAT", "40"))


@bentoml.service(workers=2, threads=4)
class Model:
    def __init__(self):
        self.booster = xgb.Booster(model_file=os.environ["FIELD_MODEL"])
        self.booster.set_param({"nthread": int(os.environ.get("FIELD_NTHREAD", "2"))})
        self.booster.inplace_predict(np.zeros((8, self.booster.num_features()), dtype=np.float32))

    @bentoml.api
    def predict(self, rows: list[list[float]]) -> dict:
        x = np.tile(np.asarray(rows, dtype=np.float32), (REPEAT, 1))
        return {"mean": float(self.booster.inplace_predict(x).mean())}
