"""An API front end with separate inference workers, the process shape of LitServe.

``python frontend_server.py PORT``: the master imports the model's runtime
(as a user's server script does), binds the socket, starts a multiprocessing
Manager, 2 inference workers (spawned, as LitServe spawns them: they hold no
socket) and 1 API process (forked after the bind: it holds the socket) that
answers HTTP and forwards each request over a queue to whichever worker takes
it, then waits for the answer. Each process's role is written to the file
``SHAPE_ROLES`` names, for the tests. Nothing here knows of tuna_lab.
"""

import json
import multiprocessing as mp
import os
import signal
import socket
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

import usermodel  # the master maps XGBoost, as a user's script importing its model does

WORKERS = 2


def inference_worker(requests, answers):
    """Load the model, warm it up (its OpenMP pool starts), then predict what the queue brings."""
    booster = usermodel.load(os.environ["USERAPP_MODEL"])
    usermodel.predict(booster, rows=200)
    while True:
        key, rows = requests.get()
        answers.put((key, usermodel.predict(booster, rows=rows)))


class _Handler(BaseHTTPRequestHandler):
    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        rows = int(json.loads(body).get("rows", 2000)) if body else 2000
        self.server.count += 1
        self.server.requests.put((self.server.count, rows))
        key, mean = self.server.answers.get()
        out = json.dumps({"mean": mean, "request": key}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


def api_server(sock, requests, answers):
    """Answer HTTP on the master's socket; one request at a time, each forwarded to the workers."""
    server = HTTPServer(sock.getsockname(), _Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.requests, server.answers, server.count = requests, answers, 0
    server.serve_forever()


def main(port):
    spawn, fork = mp.get_context("spawn"), mp.get_context("fork")
    manager = fork.Manager()
    manager.dict()["status"] = "starting"
    requests, answers = spawn.Queue(), spawn.Queue()
    workers = [spawn.Process(target=inference_worker, args=(requests, answers), daemon=True)
               for _ in range(WORKERS)]
    for w in workers:
        w.start()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    api = fork.Process(target=api_server, args=(sock, requests, answers), daemon=True)
    api.start()
    from multiprocessing import resource_tracker

    roles = [("helper", manager._process.pid), *(("worker", w.pid) for w in workers), ("front end", api.pid),
             ("helper", resource_tracker._resource_tracker._pid)]
    with open(os.environ["SHAPE_ROLES"], "a") as fh:
        fh.writelines(f"{role} {pid}\n" for role, pid in roles)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    api.join()


if __name__ == "__main__":
    main(int(sys.argv[1]))
