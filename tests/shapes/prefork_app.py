"""A pre-fork WSGI app predicting with XGBoost (``gunicorn -c prefork_conf.py prefork_app:application``).

Nothing here knows of tuna_lab. The model is loaded when a worker imports the
app, so every worker maps XGBoost; the master does not (no ``preload_app``).
"""

import json
import os

import usermodel

booster = usermodel.load(os.environ["USERAPP_MODEL"])


def application(environ, start_response):
    body = json.dumps({"mean": usermodel.predict(booster)}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
