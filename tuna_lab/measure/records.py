"""A trial's per-request records: column arrays filled in place while it runs, one frame after it.

:func:`tuna_lab.measure.loadgen.wire.drive` writes each request's status, times and
raw response into a :class:`Records`; once the trial is over,
:meth:`Records.frame` decodes the bodies (the lab server's JSON: server
time, stages, worker, CPU) and the ``Server-Timing`` headers and returns the
request table (:data:`tuna_lab.measure.schema.REQUEST_COLUMNS`). Decoding
after the trial keeps the generator's own work per request small.

Examples
--------
>>> rec = Records(2)
>>> rec.status[0], rec.raw[0] = 200, b'{"server_seconds": 0.01, "pid": 7}'
>>> rec.cut(at=1.0)
>>> rec.frame({})[["status", "error", "server_seconds", "pid"]].values.tolist()
[[200, '', 0.01, 7], [-1, 'deadline', nan, -1]]
"""

import math

import numpy as np
import pandas as pd

from .._checks import shorten
from .._files import loads_json
from ..errors import UnsafeFileError
from ..server.models import STAGES
from .schema import REQUEST_COLUMNS as COLUMNS, REQUEST_SCHED_COLUMNS
from .loadgen.server_timing import parse_server_timing, server_timing_metrics

__all__ = ["PENDING", "Records"]

#: Status of a request that has not finished (yet); never appears in a frame.
PENDING = -2
# Longest error text kept in a request's row (and Server-Timing example in attrs).
_ERROR_CHARS = 200
# The lab server's per-request scheduler metrics (tuna_lab.server.app.SCHED_METRICS) -> (column, parameter,
# factor to the column's unit); tests/test_anatomy.py checks the two agree.
# Prefixed: a user's own app may send an "rq" metric that means something else.
_SCHED_METRICS = {"tuna-rq": ("rq_wait", "dur", 1e-3), "tuna-rq-main": ("rq_wait_main", "dur", 1e-3),
                  "tuna-nvcsw": ("switches_voluntary", "desc", 1), "tuna-nivcsw": ("switches_involuntary", "desc", 1),
                  "tuna-mig": ("request_migrations", "desc", 1), "tuna-cpu-last": ("last_cpu", "desc", 1)}


class Records:
    """Column arrays of a trial, written in place by the request coroutines."""

    def __init__(self, n, scheduled=None, response="lab", metric=None):
        self.response, self.metric = response, metric
        self.status = np.full(n, PENDING, dtype=np.int64)
        self.error = np.full(n, "", dtype=object)
        self.sent = np.full(n, np.nan)
        self.done = np.full(n, np.nan)
        # Closed mode has no schedule: filled with the send time as requests go out.
        self.scheduled = np.full(n, np.nan) if scheduled is None else np.asarray(scheduled, dtype=float)
        self.server = np.full((n, 1 + len(STAGES)), np.nan)
        self.pid = np.full(n, -1, dtype=np.int64)
        # When the worker began the request, on the machine-wide monotonic clock
        # (CLOCK_MONOTONIC): lets CPU samples be split into busy and idle time.
        self.start = np.full(n, np.nan)
        # CPU seconds the worker's main thread and OpenMP pool spent on the request.
        self.cpu = np.full((n, 2), np.nan)
        # Response bodies, decoded only after the trial: keeps the event loop's
        # per-request work (and so the generator's own delay) as small as possible.
        self.raw = np.full(n, b"", dtype=object)
        # Raw Server-Timing header values (bytes, or None without one), written by drive().
        self.timing = np.full(n, None, dtype=object)
        # When the trial's clock started (its sent/done times count from it), on CLOCK_MONOTONIC: set by drive().
        self.origin = np.nan

    def cut(self, at):
        """Mark every unfinished request as cut by the trial's deadline at ``at`` seconds."""
        pending = self.status == PENDING
        self.status[pending] = -1
        self.error[pending] = "deadline"
        # A lower bound on their latency; requests not yet due get none.
        due = pending & (self.scheduled <= at)
        self.done[due] = at

    def frame(self, attrs):
        ok = np.flatnonzero((self.status >= 200) & (self.status < 300))
        if self.response == "lab":
            for i in ok:
                if self.status[i] != 204:  # No Content: nothing to read
                    _parse_ok(self, i, self.raw[i])
        attrs["server_timing"] = self._server_timing(ok)
        # CLOCK_MONOTONIC at the trial's time 0: a sampled server's counters are laid on the requests by it.
        attrs["clock_origin"] = float(self.origin)
        for i in np.flatnonzero((self.status > 0) & ((self.status < 200) | (self.status >= 300))):
            self.error[i] = _error_text(self.raw[i], self.status[i])
        n = len(self.status)
        data = {"request": np.arange(n), "status": self.status, "error": self.error,
                "client_seconds": self.done - self.scheduled, "server_seconds": self.server[:, 0]}
        data.update({name: self.server[:, k + 1] for k, name in enumerate(STAGES)})
        data.update({"pid": self.pid, "sent_at": self.sent, "scheduled_at": self.scheduled,
                     "send_lag": self.sent - self.scheduled, "server_start": self.start,
                     "cpu_main": self.cpu[:, 0], "cpu_openmp": self.cpu[:, 1]})
        data.update(self._sched(ok))
        frame = pd.DataFrame(data, columns=list(COLUMNS))
        frame.attrs.update(attrs)
        return frame

    def _sched(self, ok):
        """The per-request scheduler columns: from the ok rows' Server-Timing, and the backlog from the clocks."""
        out = {c: np.full(len(self.status), np.nan) for c in REQUEST_SCHED_COLUMNS}
        for i in ok:
            value = self.timing[i]
            if value is None:
                continue
            try:
                metrics = server_timing_metrics(value)
            except ValueError:
                continue          # counted as unparsed by _server_timing
            for name, (column, param, factor) in _SCHED_METRICS.items():
                found = metrics.get(name, {}).get(param)
                if found is not None:
                    number = _number(found)
                    out[column][i] = number * factor if number >= 0 else np.nan
        # The server's start and the client's send on one clock (the generator loads only this machine);
        # a negative gap beyond a millisecond means another clock (a server in another time namespace).
        backlog = self.start - (self.origin + self.sent)
        with np.errstate(invalid="ignore"):
            out["backlog_seconds"] = np.where(backlog >= -1e-3, np.maximum(backlog, 0.0), np.nan)
        return out

    def _server_timing(self, ok):
        """Server-Timing durations of the ok rows into ``server_seconds`` where the body gave none; the counts."""
        timing, server = self.timing, self.server
        responses = parsed = unparsed = 0
        example = None
        for i in ok:
            value = timing[i]
            if value is None:
                continue
            responses += 1
            try:
                seconds = parse_server_timing(value, self.metric)
            except ValueError:
                unparsed += 1
                if example is None:
                    example = shorten(value.decode("latin-1"), _ERROR_CHARS)
                continue
            if seconds is not None:
                parsed += 1
                if math.isnan(server[i, 0]):
                    server[i, 0] = seconds
        return {"metric": self.metric, "responses": responses, "parsed": parsed, "unparsed": unparsed,
                "example": example}


def _error_text(raw, status):
    try:
        doc = loads_json(raw)
        if isinstance(doc, dict) and "error" in doc:
            return shorten(doc["error"], _ERROR_CHARS)
    except UnsafeFileError:
        pass
    text = shorten(raw.decode("utf-8", "replace"), _ERROR_CHARS)
    return text or f"HTTP {status}"


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return np.nan


def _parse_ok(rec, i, raw):
    """Fill the server-side columns of request ``i`` from a 200 body; fields it lacks stay NaN."""
    try:
        # A server's body is bounded by the wire's read cap; its nesting here (a deep one is no lab reply).
        doc = loads_json(raw)
    except UnsafeFileError:
        rec.error[i] = "response is not JSON"
        return
    if not isinstance(doc, dict):
        rec.error[i] = "response is not a JSON object"
        return
    stages = doc.get("stages")
    stages = stages if isinstance(stages, dict) else {}
    rec.server[i] = [_number(doc.get("server_seconds")), *(_number(stages.get(k)) for k in STAGES)]
    rec.start[i] = _number(doc.get("started"))
    cpu = doc.get("cpu")
    if isinstance(cpu, dict):
        rec.cpu[i] = [_number(cpu.get("main")), _number(cpu.get("openmp"))]
    pid = doc.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool):
        rec.pid[i] = pid
