"""A LitServe server of an XGBoost model, as its docs write one: ``python server.py MODEL.json PORT``.

Two inference workers on the CPU (``workers_per_device=2``) behind LitServe's
API server process, on 127.0.0.1 only. ``POST /predict`` with
``{"rows": [[...], ...]}`` answers ``{"predictions": [...]}``.
"""

import sys

import litserve as ls
import numpy as np
import xgboost as xgb


class XGBoostAPI(ls.LitAPI):
    """Load the booster once per worker; predict a batch of rows per request."""

    def __init__(self, model_path):
        super().__init__()
        self.model_path = model_path

    def setup(self, device):
        self.booster = xgb.Booster()
        self.booster.load_model(self.model_path)

    def decode_request(self, request):
        return np.asarray(request["rows"], dtype=np.float32)

    def predict(self, rows):
        return self.booster.inplace_predict(rows)

    def encode_response(self, output):
        return {"predictions": output.tolist()}


if __name__ == "__main__":
    model_path, port = sys.argv[1], int(sys.argv[2])
    server = ls.LitServer(XGBoostAPI(model_path), accelerator="cpu", workers_per_device=2)
    server.run(host="127.0.0.1", port=port, generate_client_file=False)
