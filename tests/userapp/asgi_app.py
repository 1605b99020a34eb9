"""The same predictions as a tiny ASGI app (``uvicorn asgi_app:app --workers 2``).

The prediction runs on the event loop's thread, one request at a time, as a
small user app would do it. Nothing here knows of tuna_lab.
"""

import json
import os

import usermodel

booster = usermodel.load(os.environ["USERAPP_MODEL"])


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = json.dumps({"mean": usermodel.predict(booster)}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
