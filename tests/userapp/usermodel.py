"""The user's model: a tiny XGBoost classifier, trained once and saved to a file.

Written as a user would write it: it knows nothing of tuna_lab.
"""

import numpy as np
import xgboost as xgb

FEATURES = 16
NTHREAD = 2


def train(path, rows=2000, rounds=20, seed=0):
    """Train the model on made-up data and save it to ``path`` (JSON); returns ``path``."""
    rng = np.random.default_rng(seed)
    X = rng.random((rows, FEATURES))
    y = (X[:, 0] + X[:, 1] > 1).astype(int)
    booster = xgb.train({"nthread": NTHREAD, "max_depth": 4, "objective": "binary:logistic"},
                        xgb.DMatrix(X, y, nthread=NTHREAD), rounds)
    booster.save_model(str(path))
    return path


def load(path):
    """The saved model, set to predict with ``NTHREAD`` OpenMP threads."""
    booster = xgb.Booster(model_file=str(path))
    booster.set_param({"nthread": NTHREAD})
    return booster


def predict(booster, rows=2000, seed=None):
    """Mean prediction over ``rows`` random rows: enough work for every OpenMP thread."""
    X = np.random.default_rng(seed).random((rows, FEATURES))
    return float(booster.predict(xgb.DMatrix(X, nthread=NTHREAD)).mean())
