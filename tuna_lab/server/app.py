"""The WSGI app of the article's pattern P: one XGBoost model, five timed stages per request.

``POST /predict`` with ``{"rows": [[x1, ..., xn], ...]}`` runs, each timed
with :func:`time.perf_counter`:

1. ``deserialize`` - ``json.loads`` of the body (single-threaded);
2. ``convert`` - validation and conversion to a float32 array (single-threaded);
3. ``dmatrix`` - ``xgboost.DMatrix(X, nthread=threads)`` (OpenMP);
4. ``predict`` - ``booster.predict`` (OpenMP);
5. ``shap`` - ``booster.predict(pred_contribs=True)`` (OpenMP).

``GET /healthz`` answers 200 only once :meth:`InferenceApp.mark_ready` was
called (after the worker's threads were pinned), 503 before.

What one client may take from the others is bounded, each refusal a status
and a one-line ``error`` (all but the first in this app, before the request
is read or predicted):

* **work**: rows x the model's cost (:func:`~tuna_lab.server.models.model_cost`)
  at most :data:`MAX_WORK` (``TUNA_LAB_MAX_WORK``), and rows at most
  :func:`max_rows_default` (memory); more gets 413;
* **time**: under Gunicorn, the worker's ``timeout`` (``TUNA_LAB_TIMEOUT``,
  120 s by default) aborts a request that runs longer and replaces the worker;
* **parse**: before ``json.loads``, the body's shape (its lists, values and
  bytes) must fit the rows the bounds allow; more gets 413, and a key other
  than ``"rows"`` 400;
* **slow clients**: under :class:`~tuna_lab.server.worker.LabWorker`, a
  connection has :data:`READ_TIMEOUT` seconds from its accept to send its
  whole request, while it holds no worker; a body still missing then gets
  408, headers still missing a closed connection;
* **queue**: with ``max_wait`` set, a ``/predict`` that waited longer than
  ``max_wait`` seconds in the queue for a worker gets 503 with ``Retry-After``
  (load shedding; the wait as Linux reports it, see
  :func:`~tuna_lab.server.worker.waited`);
* **media type**: a ``/predict`` whose ``Content-Type`` is not
  ``application/json`` gets 415.

The app is created in the Gunicorn master, before it forks, so creating it
loads no XGBoost: GNU libgomp's thread pool does not survive ``fork``. Each
worker loads the booster on its first request or in :meth:`~InferenceApp.warm_up`.

Examples
--------
>>> from tuna_lab.server.app import create_app
>>> app = create_app("small", threads=2)
>>> app.ready
False
>>> # Skipped as a doctest: the warm-up loads XGBoost and starts OpenMP in this process.
>>> tids = app.warm_up()   # doctest: +SKIP
"""

import json
import logging
import os
import stat
import threading
import time
from http import HTTPStatus
from pathlib import Path

import numpy as np

from .._checks import positive_int, positive_number, shorten
from ..errors import ServerError
# The per-request scheduler evidence is shared with a user's app under the Gunicorn hooks (issue 50): defined
# once, below this layer; SCHED_METRICS, sched_delta and sched_timing stay importable from here.
from ..integrations.timing import SCHED_METRICS, sched_delta, sched_timing
from ..live.binding import threads_of
from ..live.pools import new_pool_threads
from ..machine.sched import KeptCounters
from .cpuclock import process_thread_cpu, request_cpu
# STAGES is defined by the model catalogue; re-exported as this app's stages.
from .limits import MAX_BODY_BYTES, MAX_WORK, READ_TIMEOUT, RETRY_AFTER, ROW_BUDGET_BYTES
from .models import MODEL_FEATURES, STAGES, import_xgboost, load_booster, make_rows, model_cost

__all__ = ["InferenceApp", "create_app", "app_from_env", "max_rows", "max_rows_default", "max_work", "STAGES",
           "MAX_BODY_BYTES", "ROW_BUDGET_BYTES", "MAX_WORK", "READ_TIMEOUT", "RETRY_AFTER", "SCHED_METRICS",
           "sched_delta", "sched_timing"]

log = logging.getLogger("tuna_lab.server")

_ROUTES = {"/healthz": "GET", "/predict": "POST"}
# Enough rows that every OpenMP loop in DMatrix/predict/SHAP uses all threads.
_WARM_ROWS = 64
_CHUNK = 1 << 16
#: Most bytes one JSON value of a row may take in a body, separator and indentation included (a float64's
#: repr is at most 24 characters; pretty-printed rows add their indentation): the body's byte bound per value.
VALUE_BYTES = 64
# What a body holds beyond its values: braces, the "rows" key, white space.
_SHAPE_SLACK = 4096

class _HTTPError(Exception):
    """A request the app refuses: ``status`` and a one-line ``reason`` for the client."""

    def __init__(self, status, reason, headers=()):
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, list(headers)


class InferenceApp:
    """A WSGI callable serving one model; build it with :func:`create_app`.

    Attributes
    ----------
    model : str
    threads : int
        OpenMP threads of DMatrix construction, prediction and SHAP.
    n_features : int
    max_body_bytes : int
    max_rows : int
        Most rows one request may carry; more get 413 (:func:`max_rows_default`).
    cost : int
        The model's work per row (:func:`~tuna_lab.server.models.model_cost`).
    max_work : int
        Most rows x ``cost`` one request may ask for; more get 413.
    max_wait : float or None
        Shed a ``/predict`` with 503 when it waited longer than this many
        seconds for a worker (None: never).
    read_timeout : float
        Seconds a connection has to send its request (read by
        :class:`~tuna_lab.server.worker.LabWorker`, which enforces it).
    request_log : pathlib.Path or None
        Directory of ``requests-<pid>.jsonl``; one JSON line per request
        (``time``, ``pid``, ``method``, ``path``, ``status``, ``batch``,
        ``stages`` as in the response, ``server_seconds``). Health checks
        are not logged: a poller would drown the inference requests.
    """

    def __init__(self, model, threads, max_body_bytes, request_log, max_rows=None, max_work=None, max_wait=None,
                 read_timeout=READ_TIMEOUT):
        self.model = model
        self.threads = threads
        self.n_features = MODEL_FEATURES[model]
        self.max_body_bytes = max_body_bytes
        self.max_rows = max_rows or max_rows_default(model)
        self.cost = model_cost(model)
        self.max_work = max_work or MAX_WORK
        self.max_wait = max_wait
        self.read_timeout = read_timeout
        self.request_log = request_log
        self._booster = None
        self._xgboost = None
        self._ready = False
        self._load_lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._log_file = None
        self._log_pid = None
        # Descriptors of the threads' scheduler files, opened in each worker on its first request.
        self._counters = KeptCounters()

    def __repr__(self):
        return f"InferenceApp(model={self.model!r}, threads={self.threads}, ready={self._ready})"

    # -- lifecycle --------------------------------------------------------------------

    @property
    def ready(self):
        """Whether :meth:`mark_ready` was called on this app."""
        return self._ready

    def mark_ready(self):
        """Let ``GET /healthz`` answer 200 (call it once the worker's threads are pinned).

        Examples
        --------
        >>> app = create_app("small")
        >>> app.mark_ready(); app.ready
        True
        """
        self._ready = True

    def warm_up(self):
        """Load the booster and run DMatrix, predict and SHAP once, creating the OpenMP pool.

        Returns
        -------
        list of int
            Sorted TIDs of this process that appeared during the warm-up
            under the main thread's name: the pool's ``threads - 1`` workers
            (XGBoost runs at most as many threads as CPUs); empty if the pool
            existed.

        Examples
        --------
        >>> # Skipped as a doctest: it loads XGBoost and starts an OpenMP pool in this process.
        >>> create_app("small", threads=2).warm_up()   # doctest: +SKIP
        [48213]
        """
        # Import first: XGBoost's imports (scipy's OpenBLAS) may start threads
        # of their own, and only the OpenMP pool's TIDs should be reported.
        xgboost = import_xgboost()

        before = set(threads_of(os.getpid()))
        booster, _ = self._load()
        # XGBoost hands out rows in blocks of 64 and starts no more threads
        # than blocks: warm up with enough rows to wake every pool thread.
        dm = xgboost.DMatrix(make_rows(self.model, _WARM_ROWS * max(2, 2 * self.threads)),
                             nthread=self.threads)
        booster.predict(dm)
        booster.predict(dm, pred_contribs=True)
        return new_pool_threads(os.getpid(), before)

    def _load(self):
        # A lock, not a flag: a threaded worker may get two first requests at once.
        with self._load_lock:
            if self._booster is None:
                self._booster = load_booster(self.model, self.threads)
                self._xgboost = import_xgboost()
        return self._booster, self._xgboost

    # -- WSGI -------------------------------------------------------------------------

    def __call__(self, environ, start_response):
        t0 = time.perf_counter()
        started = time.time()
        # CLOCK_MONOTONIC is machine-wide: the client can line this up with its
        # own samples of this worker's CPU time (tuna_lab.measure.cpu).
        info = {"batch": None, "started": time.monotonic()}
        method = environ.get("REQUEST_METHOD", "GET").upper()
        path = environ.get("PATH_INFO") or "/"
        stages = dict.fromkeys(STAGES)
        headers = []
        try:
            status, body = self._route(method, path, environ, stages, info, t0)
            if "timing" in info:
                headers.append(("Server-Timing", info["timing"]))
        except _HTTPError as exc:
            status, body, headers = exc.status, {"error": exc.reason}, exc.headers
        except Exception as exc:   # never a traceback to the client; the log gets it
            log.exception("%s %s failed", method, path)
            status, body = 500, {"error": shorten(f"internal error: {type(exc).__name__}: {exc}")}
        if path != "/healthz":
            seconds = body.get("server_seconds", time.perf_counter() - t0)
            self._record({"time": started, "pid": os.getpid(), "method": method, "path": path,
                          "status": status, "batch": info["batch"], "stages": stages,
                          "server_seconds": seconds})
        data = json.dumps(body).encode()
        phrase = HTTPStatus(status).phrase
        start_response(f"{status} {phrase}", [("Content-Type", "application/json"),
                                              ("Content-Length", str(len(data))), *headers])
        return [data]

    def _route(self, method, path, environ, stages, info, t0):
        allowed = _ROUTES.get(path)
        if allowed is None:
            raise _HTTPError(404, f"no such path {path!r}; use POST /predict or GET /healthz")
        if method != allowed:
            raise _HTTPError(405, f"{method} is not allowed on {path}; use {allowed}", [("Allow", allowed)])
        if path == "/healthz":
            return self._health()
        # Before anything is read: a shed request costs the worker next to nothing.
        self._shed(environ)
        _check_content_type(environ)
        # The CPU clocks of this worker's threads at the request's boundaries:
        # what the request cost, exactly, and (by difference with the whole
        # trial) what the threads burn between requests.
        t_read = time.perf_counter()
        before = process_thread_cpu()
        # The scheduler's counters of the same threads (the calling thread and its team): what they waited
        # for a CPU, were switched and moved during this request, not per trial (issue 50).
        sched_before = self._counters.read(before)
        # The reads themselves are not the request's work: keep them out of server_seconds.
        t0 += time.perf_counter() - t_read
        status, body = self._predict(environ, stages, info, t0)
        after = process_thread_cpu()
        body["cpu"] = request_cpu(before, after)
        delta = sched_delta(sched_before, self._counters.read(after), threading.get_native_id())
        info["timing"] = sched_timing(body["server_seconds"], sum(body["cpu"].values()), delta)
        return status, body

    def _health(self):
        body = {"status": "ok", "pid": os.getpid(), "ready": self._ready, "model": self.model,
                "threads": self.threads}
        if not self._ready:
            body.update(status="unavailable",
                        reason="worker not ready: threads not pinned yet (mark_ready not called)")
            return 503, body
        return 200, body

    def _shed(self, environ):
        # LabWorker says, as it takes the connection, how long its request waited for a worker.
        waited = getattr(environ.get("gunicorn.socket"), "waited", None)
        if self.max_wait is not None and waited is not None and waited > self.max_wait:
            raise _HTTPError(503, f"overloaded: the request waited {waited:.2f} s for a worker, more than the "
                                  f"bound of {self.max_wait:g} s; retry after {RETRY_AFTER} s",
                             [("Retry-After", str(RETRY_AFTER))])

    def _predict(self, environ, stages, info, t0):
        body = self._read_body(environ)

        t = time.perf_counter()
        # Before json.loads: its time and memory grow with everything the body holds, not only the rows.
        self._check_shape(body)
        doc = _deserialize(body)
        stages["deserialize"] = time.perf_counter() - t

        t = time.perf_counter()
        X = self._convert(doc, body)
        stages["convert"] = time.perf_counter() - t
        info["batch"] = len(X)

        booster, xgboost = self._load()   # no-op after warm_up()

        t = time.perf_counter()
        dm = xgboost.DMatrix(X, nthread=self.threads)
        stages["dmatrix"] = time.perf_counter() - t

        t = time.perf_counter()
        booster.predict(dm)
        stages["predict"] = time.perf_counter() - t

        t = time.perf_counter()
        booster.predict(dm, pred_contribs=True)
        stages["shap"] = time.perf_counter() - t

        return 200, {"count": len(X), "stages": dict(stages), "server_seconds": time.perf_counter() - t0,
                     "pid": os.getpid(), "started": info["started"]}

    def _read_body(self, environ):
        try:
            return self._read_stream(environ)
        except _HTTPError:
            raise
        except TimeoutError:
            # LabWorker's deadline (or a socket timeout of another server's)
            raise _HTTPError(408, f"request body not received within {self.read_timeout:g} s") from None
        except Exception as exc:
            # The server's input stream fails only on the client's bytes (bad
            # chunked framing, a dropped connection); its classes vary by server.
            reason = f"could not read the request body: {type(exc).__name__}: {exc}"
            raise _HTTPError(400, shorten(reason)) from None

    def _read_stream(self, environ):
        stream = environ["wsgi.input"]
        length = environ.get("CONTENT_LENGTH") or ""
        if length:
            try:
                n = int(length)
                if n < 0:
                    raise ValueError
            except ValueError:
                raise _HTTPError(400, f"invalid Content-Length {length!r}") from None
            if n > self.max_body_bytes:
                # Refused before reading: a huge body never reaches memory.
                raise _HTTPError(413, f"body of {n} bytes exceeds the limit of {self.max_body_bytes} bytes")
            return stream.read(n) if n else b""
        # Without a length, reading to EOF is only safe where the server says
        # the stream ends (Gunicorn does); elsewhere it could block forever.
        if not environ.get("wsgi.input_terminated"):
            return b""
        chunks, size = [], 0
        while True:
            chunk = stream.read(min(_CHUNK, self.max_body_bytes + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _HTTPError(413, f"body exceeds the limit of {self.max_body_bytes} bytes")

    def _check_rows(self, n):
        """413 when ``n`` rows are more than the row limit or the work bound allows."""
        if n > self.max_rows:
            # Before the rows are looked at or converted: the worker's memory stays bounded.
            raise _HTTPError(413, f"{n} rows exceed the limit of {self.max_rows} rows per request "
                                  "(TUNA_LAB_MAX_ROWS); send smaller batches")
        if n * self.cost > self.max_work:
            # Before anything is predicted: the time a request holds a worker stays bounded too.
            raise _HTTPError(413, f"{n} rows x cost {self.cost} of model {self.model!r} = "
                                  f"{n * self.cost:,} exceed the work bound of {self.max_work:,} per request "
                                  f"(TUNA_LAB_MAX_WORK); send at most {self.max_work // self.cost} rows")

    def _check_shape(self, body):
        """413 before ``json.loads`` for a body that holds more than the rows the bounds allow could.

        The parse costs time and memory in proportion to the bytes and the
        JSON values of the whole body (a 50 MiB list under an unused key held
        a worker 25 s at 1.36 GB), so the work bound counts it, by the body's
        shape: its lists (each ``[`` opens one; a body of rows has one per row
        and one around them), its values (each ``,`` separates two) and its
        bytes (at most ``VALUE_BYTES`` a value) must fit what the allowed
        rows hold. Three passes of ``bytes.count`` over the body: milliseconds.
        """
        rows = body.count(b"[") - 1
        # Exact for a body of rows; a body of another shape is refused in the rows' own terms.
        self._check_rows(rows)
        rows = max(rows, 1)
        # Commas separate the values of a row and the rows: a body of rows has fewer than rows x (features + 1).
        values = body.count(b",") + 1
        if values > rows * (self.n_features + 1):
            raise _HTTPError(413, f"the body holds {values:,} JSON values, more than its {rows:,} rows of "
                                  f'{self.n_features} features do; send only {{"rows": [[x1, ..., xn], ...]}}')
        most = rows * self.n_features * VALUE_BYTES + _SHAPE_SLACK
        if len(body) > most:
            raise _HTTPError(413, f"the body's {len(body):,} bytes are more than {rows:,} rows of "
                                  f"{self.n_features} numbers take ({VALUE_BYTES} bytes a value: at most {most:,}); "
                                  f'send only {{"rows": [[x1, ..., xn], ...]}}')

    def _convert(self, doc, body):
        if not isinstance(doc, dict) or "rows" not in doc:
            raise _HTTPError(400, 'body must be a JSON object with a "rows" key')
        others = sorted(k for k in doc if k != "rows")
        if others:
            raise _HTTPError(400, shorten(f'unknown key(s) {", ".join(map(repr, others))}: the body holds "rows" only',
                                          200))
        rows = doc["rows"]
        if not isinstance(rows, list) or not rows:
            raise _HTTPError(400, '"rows" must be a non-empty list of lists')
        self._check_rows(len(rows))
        for i, row in enumerate(rows):
            if not isinstance(row, list):
                raise _HTTPError(400, f'"rows"[{i}] is not a list')
        widths = {len(row) for row in rows}
        if len(widths) > 1:
            raise _HTTPError(400, f"rows have different lengths: {sorted(widths)[:5]}")
        width = widths.pop()
        if width != self.n_features:
            raise _HTTPError(400, f"model {self.model!r} expects {self.n_features} features per row, got {width}")
        # numpy would read true/false as 1/0 next to numbers; look only when the body has them.
        if (b"true" in body or b"false" in body) and _has_bool(rows):
            raise _HTTPError(400, "rows must hold numbers only, found true/false")
        try:
            arr = np.array(rows)
        except (ValueError, TypeError, OverflowError):
            arr = None
        if arr is None or arr.ndim != 2 or arr.dtype.kind not in "iuf":
            raise _HTTPError(400, "rows must hold numbers only (no strings, null or nested lists)")
        with np.errstate(over="ignore", invalid="ignore"):
            X = arr.astype(np.float32)
        if not np.isfinite(X).all():
            raise _HTTPError(400, "rows hold a non-finite value (NaN, Infinity or beyond float32 range)")
        return X

    def _record(self, record):
        if self.request_log is None:
            return
        line = json.dumps(record) + "\n"
        try:
            with self._log_lock:
                # Opened per pid: the app object was created in the master
                # before the fork, so the file belongs to whichever worker runs.
                if self._log_pid != os.getpid():
                    self._log_pid = os.getpid()
                    path = self.request_log / f"requests-{self._log_pid}.jsonl"
                    # Line-buffered: each record is on disk even if the worker is SIGKILLed.
                    # Never through a link another user planted in the folder, nor into a FIFO (an open
                    # that waits for a reader) or a device: a regular file, or none.
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                                 | os.O_CLOEXEC, 0o644)
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        os.close(fd)
                        raise OSError(f"{path} is not a regular file")
                    os.set_blocking(fd, True)
                    self._log_file = os.fdopen(fd, "a", buffering=1)
                self._log_file.write(line)
        except OSError as exc:
            log.warning("request log not written: %s", exc)


def max_rows_default(model):
    """The default row limit of a request to ``model``: the rows whose float64 input fits :data:`ROW_BUDGET_BYTES`.

    Examples
    --------
    >>> max_rows_default("small"), max_rows_default("large")
    (225986, 8359)
    """
    return max(1, ROW_BUDGET_BYTES // (8 * MODEL_FEATURES[model]))


def max_rows(model, environ=None):
    """Most rows one request to ``model`` may carry: the smaller of its row limit and its work bound.

    The row limit is ``TUNA_LAB_MAX_ROWS``, else :func:`max_rows_default`
    (memory); the work bound allows :func:`max_work` // the model's cost
    (:func:`~tuna_lab.server.models.model_cost`) rows. The server answers a
    request with more rows 413 with the reason; a measurement checks its
    batch against this before it starts a server.

    Examples
    --------
    >>> max_rows("medium", {"TUNA_LAB_MAX_ROWS": "500"})
    500
    >>> max_rows("medium", {}), max_rows("large", {})
    (22321, 8359)
    >>> max_rows("small", {"TUNA_LAB_MAX_WORK": "3840000"})
    1000
    """
    env = os.environ if environ is None else environ
    if model not in MODEL_FEATURES:
        raise ServerError(f"unknown model {model!r}; choose from {', '.join(MODEL_FEATURES)}")
    rows = _env_int(env, "TUNA_LAB_MAX_ROWS") or max_rows_default(model)
    return max(1, min(rows, max_work(env) // model_cost(model)))


def max_work(environ=None):
    """The work bound of one request: ``TUNA_LAB_MAX_WORK``, else :data:`MAX_WORK`.

    Examples
    --------
    >>> max_work({}) == MAX_WORK, max_work({"TUNA_LAB_MAX_WORK": "1000"})
    (True, 1000)
    """
    return _env_int(os.environ if environ is None else environ, "TUNA_LAB_MAX_WORK") or MAX_WORK


def _env_int(env, var):
    """The positive integer in ``env[var]``; None when unset or empty; ServerError otherwise."""
    text = env.get(var)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ServerError(f"{var} must be a positive integer, got {text!r}")
    return value


def _check_content_type(environ):
    """415 unless the request says its body is JSON (``application/json``, parameters such as charset allowed)."""
    value = environ.get("CONTENT_TYPE") or ""
    if value.split(";", 1)[0].strip().lower() != "application/json":
        said = f"Content-Type {shorten(value, 80)!r} is not JSON" if value.strip() else "no Content-Type"
        raise _HTTPError(415, f"{said}; send the rows as application/json")


def create_app(model="medium", threads=1, max_body_bytes=MAX_BODY_BYTES, request_log=None, max_rows=None,
               max_work=None, max_wait=None, read_timeout=READ_TIMEOUT):
    """Build the WSGI app; cheap, and loads no XGBoost.

    Parameters
    ----------
    model : {"small", "medium", "large"}
    threads : int
        OpenMP threads per worker.
    max_body_bytes : int
        Larger request bodies get 413.
    max_rows : int, optional
        Requests with more rows get 413; default :func:`max_rows_default`.
    max_work : int, optional
        Requests whose rows x the model's cost
        (:func:`~tuna_lab.server.models.model_cost`) exceed it get 413,
        before anything is predicted; default :data:`MAX_WORK`.
    max_wait : float, optional
        Shed a ``/predict`` with 503 and ``Retry-After`` when it waited
        longer than this many seconds in the queue for a worker (as
        :class:`~tuna_lab.server.worker.LabWorker` measures it); default: never.
    read_timeout : float
        Seconds a connection has to send its whole request under
        :class:`~tuna_lab.server.worker.LabWorker` (a missing body then gets 408).
    request_log : str or path-like, optional
        Directory for ``requests-<pid>.jsonl`` (created if missing).

    Examples
    --------
    >>> create_app("small", threads=4)
    InferenceApp(model='small', threads=4, ready=False)
    >>> create_app("small", max_wait=0)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ServerError: max_wait must be a positive finite number, got 0
    """
    if model not in MODEL_FEATURES:
        raise ServerError(f"unknown model {model!r}; choose from {', '.join(MODEL_FEATURES)}")
    threads = positive_int("threads", threads, ServerError)
    max_body_bytes = positive_int("max_body_bytes", max_body_bytes, ServerError)
    if max_rows is not None:
        max_rows = positive_int("max_rows", max_rows, ServerError)
    if max_work is not None:
        max_work = positive_int("max_work", max_work, ServerError)
    if max_wait is not None:
        max_wait = positive_number("max_wait", max_wait, ServerError)
    read_timeout = positive_number("read_timeout", read_timeout, ServerError)
    if request_log is not None:
        request_log = Path(request_log)
        try:
            request_log.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ServerError(f"cannot create request log directory {str(request_log)!r}: {exc.strerror}") from None
    return InferenceApp(model, threads, max_body_bytes, request_log, max_rows, max_work, max_wait, read_timeout)


def app_from_env(environ=None):
    """Build the app from ``TUNA_LAB_MODEL``, ``TUNA_LAB_THREADS``, ``TUNA_LAB_MAX_BODY``, ``TUNA_LAB_MAX_ROWS``,
    ``TUNA_LAB_MAX_WORK``, ``TUNA_LAB_MAX_WAIT``, ``TUNA_LAB_READ_TIMEOUT``, ``TUNA_LAB_REQUEST_LOG``.

    Unset or empty variables take :func:`create_app`'s defaults.

    Examples
    --------
    >>> app_from_env({"TUNA_LAB_MODEL": "large", "TUNA_LAB_THREADS": "4"}).threads
    4
    >>> app_from_env({"TUNA_LAB_MAX_WAIT": "0.5", "TUNA_LAB_READ_TIMEOUT": "2.5"}).read_timeout
    2.5
    """
    env = os.environ if environ is None else environ
    kwargs = {}
    if env.get("TUNA_LAB_MODEL"):
        kwargs["model"] = env["TUNA_LAB_MODEL"]
    for var, key in (("TUNA_LAB_THREADS", "threads"), ("TUNA_LAB_MAX_BODY", "max_body_bytes"),
                     ("TUNA_LAB_MAX_ROWS", "max_rows"), ("TUNA_LAB_MAX_WORK", "max_work")):
        value = _env_int(env, var)
        if value is not None:
            kwargs[key] = value
    for var, key in (("TUNA_LAB_MAX_WAIT", "max_wait"), ("TUNA_LAB_READ_TIMEOUT", "read_timeout")):
        if env.get(var):
            try:
                kwargs[key] = float(env[var])
            except ValueError:
                raise ServerError(f"{var} must be a positive number of seconds, got {env[var]!r}") from None
    return create_app(request_log=env.get("TUNA_LAB_REQUEST_LOG") or None, **kwargs)


def _deserialize(body):
    if not body.strip():
        raise _HTTPError(400, 'empty body; send {"rows": [[x1, ..., xn], ...]}')
    try:
        return json.loads(body)
    except ValueError as exc:   # JSONDecodeError and UnicodeDecodeError
        raise _HTTPError(400, shorten(f"malformed JSON: {exc}")) from None
    except RecursionError:
        raise _HTTPError(400, "malformed JSON: nested too deeply") from None


def _has_bool(rows):
    return any(type(v) is bool for row in rows for v in row)
