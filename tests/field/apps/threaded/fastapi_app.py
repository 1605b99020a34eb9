"""FastAPI with a sync endpoint (run on anyio's worker threads) and an async one (run on the event loop).

Served by ``uvicorn fastapi_app:app --workers 2``; the model is ``$FIELD_MODEL``
with ``nthread`` from ``$FIELD_NTHREAD``, loaded in each worker.
"""

import os

import numpy as np
import xgboost as xgb
from fastapi import FastAPI
from pydantic import BaseModel

#: Each request's rows predicted this many times over: the model, not HTTP, is the work (as in the field).
REPEAT = int(os.environ.get("FIELD_REPEAT", "40"))

booster = xgb.Booster(model_file=os.environ["FIELD_MODEL"])
booster.set_param({"nthread": int(os.environ.get("FIELD_NTHREAD", "2"))})
booster.inplace_predict(np.zeros((8, booster.num_features()), dtype=np.float32))
app = FastAPI()


def _mean(rows):
    return float(booster.inplace_predict(np.tile(np.asarray(rows, dtype=np.float32), (REPEAT, 1))).mean())


class Rows(BaseModel):
    rows: list[list[float]]


@app.post("/predict")
def predict(req: Rows):
    return {"mean": _mean(req.rows)}


@app.post("/predict_async")
async def predict_async(req: Rows):
    return {"mean": _mean(req.rows)}
