"""A master that parses HTTP and JSON itself and dispatches to worker processes, the shape of MLServer.

``python dispatch_server.py PORT``: the master listens, parses every request
(a threaded HTTP server) and puts it on a queue; 2 worker processes (spawned,
as MLServer's parallel workers are) load the model and predict. The master
never loads the runtime. Each process's role is written to the file
``SHAPE_ROLES`` names, for the tests. Nothing here knows of tuna_lab.
"""

import json
import multiprocessing as mp
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORKERS = 2


def worker(requests, answers):
    """Load the model, warm it up (its OpenMP pool starts), then predict what the queue brings."""
    import usermodel

    booster = usermodel.load(os.environ["USERAPP_MODEL"])
    usermodel.predict(booster, rows=200)
    while True:
        key, rows = requests.get()
        answers.put((key, usermodel.predict(booster, rows=rows)))


class _Handler(BaseHTTPRequestHandler):
    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        self.server.dispatch.put(int(body.get("rows", 2000)))
        mean = self.server.dispatch.result()
        out = json.dumps({"mean": mean}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


class _Dispatch:
    """Requests out over one queue, answers back over another, matched by key."""

    def __init__(self, requests, answers):
        self.requests, self.answers = requests, answers
        self.lock, self.next, self.done, self.local = threading.Lock(), 0, {}, threading.local()
        self.ready = threading.Condition(self.lock)
        threading.Thread(target=self._collect, daemon=True).start()

    def put(self, rows):
        with self.lock:
            self.next += 1
            self.local.key = self.next
        self.requests.put((self.local.key, rows))

    def result(self):
        with self.ready:
            self.ready.wait_for(lambda: self.local.key in self.done)
            return self.done.pop(self.local.key)

    def _collect(self):
        while True:
            key, mean = self.answers.get()
            with self.ready:
                self.done[key] = mean
                self.ready.notify_all()


def main(port):
    from multiprocessing import resource_tracker

    ctx = mp.get_context("spawn")
    requests, answers = ctx.Queue(), ctx.Queue()
    workers = [ctx.Process(target=worker, args=(requests, answers), daemon=True) for _ in range(WORKERS)]
    for w in workers:
        w.start()
    roles = [*(("worker", w.pid) for w in workers), ("helper", resource_tracker._resource_tracker._pid)]
    with open(os.environ["SHAPE_ROLES"], "a") as fh:
        fh.writelines(f"{role} {pid}\n" for role, pid in roles)
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    server.daemon_threads = True
    server.dispatch = _Dispatch(requests, answers)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]))
