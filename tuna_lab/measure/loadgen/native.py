"""Which loop runs a trial, and the call into the C one (issue 50: a load generator at wrk's cost).

:func:`tuna_lab.measure.loadgen.wire.drive` runs each trial on one of two loops that write the same
rows: the C extension ``_engine`` (``_engine.c``, built by ``pip install`` through setup.py) when it
was built, else the Python loop of :mod:`~tuna_lab.measure.loadgen.wire`, which is also what a caller
gets who asks for ``engine="python"``. The C loop reads the usual response itself and hands a rare
one (an interim 1xx, ``Transfer-Encoding``, several ``Server-Timing`` headers, a malformed status
line) to the same Python parser, :func:`~tuna_lab.measure.loadgen.response.parse_buffer`, so both
loops give the same answer and the same error text for it.

The loop that ran, and why when it is not the C one, is kept on the trial's recorder as
``rec.engine`` (``{"engine": "c" or "python", "engine_why": str}``), never silently.

Examples
--------
>>> choose("python")
('python', 'asked for')
>>> choose(None)[0] in ("c", "python")
True
"""

import numpy as np

from ..._checks import shorten
from ...errors import LoadError
from .response import parse_buffer

try:
    from . import _engine
    _MISSING = ""
except ImportError as _exc:   # no compiler or headers at install time (setup.py: optional=True)
    _engine = None
    _MISSING = (f"the C engine is not built ({shorten(str(_exc), 120)}); reinstall with gcc and the Python "
                "headers present: pip install -e .")

__all__ = ["ENGINES", "choose", "run"]

#: What ``engine=`` may ask for: the C loop, the Python loop, or None (the C loop when it is built).
ENGINES = ("c", "python")

# Longest error text kept in a request's row (as wire's).
_ERROR_CHARS = 200
# Requests up to this size fit one TCP segment on loopback (as wire's: no TCP_NODELAY needed).
_ONE_SEGMENT = 16384


def choose(engine=None):
    """``(name, why)``: the loop a trial runs on for ``engine`` (None, ``"c"`` or ``"python"``).

    ``why`` is empty for the C loop, else why the Python one runs.

    Raises
    ------
    LoadError
        An unknown ``engine``, or ``"c"`` where the extension is not built.
    """
    if engine is None:
        return ("c", "") if _engine is not None else ("python", _MISSING)
    if engine not in ENGINES:
        raise LoadError(f"engine must be one of {', '.join(ENGINES)} or None, got {shorten(repr(engine), 40)}")
    if engine == "c" and _engine is None:
        raise LoadError(_MISSING)
    return engine, "" if engine == "c" else "asked for"


def run(rec, address, requests, concurrency, timeout, deadline, schedule=None, reuse=None):
    """:func:`~tuna_lab.measure.loadgen.wire.drive`'s trial on the C loop (arguments checked there).

    ``requests`` is a non-empty tuple of bytes. Returns the seconds from the start to the trial's end;
    ``rec``'s rows and ``rec.origin`` are written as the Python loop writes them.
    """
    n = len(rec.status)
    heads = tuple(r.startswith(b"HEAD ") for r in requests)
    heads = heads if any(heads) else None
    timing = getattr(rec, "timing", None) is not None
    # See wire._Engine: TCP_NODELAY only for a request of several segments; SO_RCVLOWAT (0: not set
    # yet, -1: never) only where no answer is a HEAD's (its headers alone).
    nodelay = max(len(r) for r in requests) > _ONE_SEGMENT
    lowat = 0 if heads is None else -1
    # Contiguous copies the C loop writes in place (a recorder's arrays may be views), copied back below.
    sent, done = np.array(rec.sent, dtype=np.float64), np.array(rec.done, dtype=np.float64)
    scheduled, status = np.array(rec.scheduled, dtype=np.float64), np.array(rec.status, dtype=np.int64)
    raw, error = list(rec.raw), list(rec.error)
    st = [None] * n if timing else None
    at = None
    if schedule is not None:
        at = np.ascontiguousarray(schedule, dtype=np.float64)
        if len(at) < n:
            raise LoadError(f"schedule has {len(at)} send times for {n} requests")
    limits = (int(concurrency), float(timeout), float(deadline), -1 if reuse is None else int(reuse))
    t0 = np.nan
    try:
        end, t0 = _engine.drive(address, requests, heads, limits, at, (lowat, nodelay, timing),
                                (sent, done, scheduled, status, raw, error, st), parse_buffer)
    finally:
        # What the trial wrote so far, even when it was interrupted (as the Python loop's finally).
        rec.sent[:], rec.done[:], rec.scheduled[:], rec.status[:] = sent, done, scheduled, status
        rec.origin = t0
        for i in np.flatnonzero(status == -1):
            if error[i]:
                error[i] = shorten(error[i], _ERROR_CHARS)
        rec.raw[:], rec.error[:] = np.fromiter(raw, object, n), np.fromiter(error, object, n)
        if st is not None:
            rec.timing[:] = np.fromiter(st, object, n)
    return end
