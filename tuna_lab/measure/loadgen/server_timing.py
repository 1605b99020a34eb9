"""The W3C ``Server-Timing`` header: the duration of one metric, as the load generator reads it.

A server may say how long it worked on a request in this header
(https://www.w3.org/TR/server-timing/); :func:`parse_server_timing` reads
it, and :mod:`tuna_lab.measure.loadgen.load` takes it as a request's
``server_seconds`` where the body says nothing.

Examples
--------
>>> parse_server_timing('db;dur=2.5, app;dur=12.5;desc="model"', "app")
0.0125
>>> bool(METRIC_NAME.fullmatch("app")), bool(METRIC_NAME.fullmatch("a b"))
(True, False)
"""

import math
import re

from ..._checks import shorten

__all__ = ["METRIC_NAME", "parse_server_timing", "server_timing_metrics"]

#: A metric name: a token of RFC 7230 (what ``server_timing=`` may name).
METRIC_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

# The rest of the W3C Server-Timing grammar: optional whitespace, a quoted string.
_ST_OWS = re.compile(r"[ \t]*")
_ST_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ST_ESCAPE = re.compile(r"\\(.)")
# A duration (milliseconds): a decimal number.
_ST_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _server_timing_metrics(text):
    """The ``(name, params)`` of each metric of Server-Timing value ``text``, in order.

    ``params`` maps each lower-cased parameter name to its first value
    (unquoted; "" for a parameter without ``=``). ValueError when ``text``
    does not follow the grammar.
    """
    def fail(pos, what):
        raise ValueError(f"Server-Timing: expected {what} at character {pos} of {shorten(text, 80)!r}")

    ows, token, n = _ST_OWS.match, METRIC_NAME.match, len(text)
    metrics = []
    pos = ows(text, 0).end()
    while pos < n:
        if text[pos] == ",":  # an empty list element
            pos = ows(text, pos + 1).end()
            continue
        m = token(text, pos)
        if m is None:
            fail(pos, "a metric name")
        name, params = m.group(), {}
        pos = ows(text, m.end()).end()
        while pos < n and text[pos] == ";":
            pos = ows(text, pos + 1).end()
            m = token(text, pos)
            if m is None:
                fail(pos, "a parameter name")
            key, value = m.group().lower(), ""
            pos = ows(text, m.end()).end()
            if pos < n and text[pos] == "=":
                pos = ows(text, pos + 1).end()
                m = _ST_QUOTED.match(text, pos) if text.startswith('"', pos) else token(text, pos)
                if m is None:
                    fail(pos, "a parameter value (a token or a quoted string)")
                value = _ST_ESCAPE.sub(r"\1", m.group(1)) if m.lastindex else m.group()
                pos = ows(text, m.end()).end()
            params.setdefault(key, value)
        if pos < n and text[pos] != ",":
            fail(pos, "',' or ';'")
        metrics.append((name, params))
    return metrics


def parse_server_timing(value, metric=None):
    """The duration in seconds of one metric of a W3C ``Server-Timing`` header value.

    The header (https://www.w3.org/TR/server-timing/) lists metrics, each a
    name with optional parameters: ``db;dur=53;desc="select, join", app;dur=47.2``.
    ``dur`` is in milliseconds; the answer is in seconds. Parameter names
    are case-insensitive and the first of a repeated one counts; metric names
    are compared as they are. Several headers are one value joined by ``", "``.

    Parameters
    ----------
    value : str or bytes
        The header's value (bytes are read as Latin-1).
    metric : str, optional
        The metric whose duration is wanted (the first of that name that
        has a ``dur``). Default: the first metric that has a ``dur``.

    Returns
    -------
    float or None
        Seconds, or None when no such metric (or no ``dur``) is there.

    Raises
    ------
    ValueError
        A value that does not follow the grammar, or a ``dur`` that is not a
        non-negative decimal number.

    Examples
    --------
    >>> parse_server_timing('cache;desc="hit; fast, warm", db;dur=2.5, app;dur=12.5')
    0.0025
    >>> parse_server_timing(b"db;dur=2.5, app;dur=12.5", metric="app")
    0.0125
    >>> parse_server_timing("cache;desc=hit") is None, parse_server_timing("db;dur=1", "app") is None
    (True, True)
    >>> parse_server_timing("app;dur=abc")
    Traceback (most recent call last):
    ...
    ValueError: Server-Timing: dur of 'app' is not a number of milliseconds: 'abc'
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode("latin-1")
    if not isinstance(value, str):
        raise TypeError(f"value must be str or bytes, got {type(value).__name__}")
    found = None
    for name, params in _server_timing_metrics(value):
        dur = params.get("dur")
        if dur is None:
            continue
        if not _ST_NUMBER.fullmatch(dur) or not 0 <= float(dur) < math.inf:
            raise ValueError(f"Server-Timing: dur of {name!r} is not a number of milliseconds: {shorten(dur, 40)!r}")
        if found is None and (metric is None or name == metric):
            found = float(dur) / 1000.0
    return found


def server_timing_metrics(value):
    """Every metric of a ``Server-Timing`` value as ``{name: params}`` (the first of each name counts).

    ``params`` maps each lower-cased parameter name to its value as text
    (``dur`` in milliseconds, as sent). The lab server sends its scheduler
    evidence per request this way (:data:`tuna_lab.server.app.SCHED_METRICS`).

    Raises
    ------
    ValueError
        A value that does not follow the grammar.

    Examples
    --------
    >>> server_timing_metrics(b"app;dur=12.5, rq;dur=0.25, mig;desc=2, rq;dur=9")
    {'app': {'dur': '12.5'}, 'rq': {'dur': '0.25'}, 'mig': {'desc': '2'}}
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode("latin-1")
    out = {}
    for name, params in _server_timing_metrics(value):
        out.setdefault(name, params)
    return out
