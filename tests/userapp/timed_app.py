"""A user's WSGI app that says how long each prediction took, in a W3C ``Server-Timing`` header.

``/`` predicts; ``/fail`` answers 500; ``/garbled`` sends a ``Server-Timing``
that does not parse. The model file is named by ``USERAPP_MODEL``. Nothing
here knows of tuna_lab.
"""

import json
import os
import time

import usermodel

booster = usermodel.load(os.environ["USERAPP_MODEL"])


def application(environ, start_response):
    path = environ.get("PATH_INFO", "/")
    if path == "/fail":
        start_response("500 Internal Server Error", [("Content-Type", "text/plain"), ("Content-Length", "4")])
        return [b"oops"]
    t0 = time.perf_counter()
    body = json.dumps({"mean": usermodel.predict(booster)}).encode()
    took = (time.perf_counter() - t0) * 1e3
    timing = "app;dur=abc" if path == "/garbled" else f'app;dur={took:.3f};desc="predict", db;dur=0.1'
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                              ("Server-Timing", timing)])
    return [body]
