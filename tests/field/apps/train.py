"""Train the XGBoost model the field servers serve, on data made here (nothing is downloaded).

Run with the framework's own interpreter, so the model is written by the XGBoost
that will load it: ``python train.py MODEL.json FEATURES``.
"""

import sys

import numpy as np
import xgboost as xgb


def train(path, features, rows=4000, seed=0):
    """Fit a regression booster on a random linear target with noise and save it as JSON."""
    rng = np.random.default_rng(seed)
    x = rng.random((rows, features), dtype=np.float32)
    y = x @ rng.normal(size=features).astype(np.float32) + rng.normal(scale=0.1, size=rows).astype(np.float32)
    booster = xgb.train({"max_depth": 6, "eta": 0.1, "objective": "reg:squarederror", "seed": seed},
                        xgb.DMatrix(x, label=y), num_boost_round=80)
    booster.save_model(path)


if __name__ == "__main__":
    train(sys.argv[1], int(sys.argv[2]))
