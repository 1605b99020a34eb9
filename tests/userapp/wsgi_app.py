"""A user's plain WSGI app serving XGBoost predictions (``gunicorn wsgi_app:application``).

The model file is named by ``USERAPP_MODEL``. Nothing here knows of tuna_lab.
"""

import json
import os

import usermodel

booster = usermodel.load(os.environ["USERAPP_MODEL"])


def application(environ, start_response):
    body = json.dumps({"mean": usermodel.predict(booster)}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
