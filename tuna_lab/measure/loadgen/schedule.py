"""What a load test sends, and when: the lab server's request body and Poisson send times.

Both are built before a trial starts, so that the generator spends no time
encoding or drawing while it measures. :mod:`tuna_lab.measure.loadgen.load` sends
them (and re-exports both names).

Examples
--------
>>> from tuna_lab.measure.loadgen.schedule import poisson_schedule
>>> len(poisson_schedule(50.0, duration=1.0, seed=0)) > 0
True
"""

import json
import math

import numpy as np

from ..._checks import positive_int, positive_number
from ...errors import LoadError
from ...server.models import make_rows

__all__ = ["payload", "poisson_schedule", "MAX_REQUESTS"]

#: An upper bound on a schedule, so that a typo in rate * duration cannot exhaust memory.
MAX_REQUESTS = 10_000_000


def payload(model, batch, seed=0):
    """The JSON body of a ``POST /predict``: ``batch`` rows of ``model``, encoded once.

    Build it once per trial and send the same bytes with every request, so
    the generator spends no time encoding while it measures.

    Parameters
    ----------
    model : {"small", "medium", "large"}
    batch : int
        Rows per request.
    seed : int
        Seed of :func:`tuna_lab.server.models.make_rows`.

    Returns
    -------
    bytes

    Examples
    --------
    >>> body = payload("small", 2)
    >>> len(json.loads(body)["rows"][0])
    29
    """
    rows = make_rows(model, batch, seed)
    return json.dumps({"rows": rows.tolist()}, separators=(",", ":")).encode()


def poisson_schedule(rate, requests=None, duration=None, seed=0):
    """Send times (seconds from the trial's start) of a Poisson arrival process.

    Inter-arrival times are exponential with mean ``1 / rate``, drawn from
    ``numpy.random.default_rng(seed)``; the first request is sent at 0. The
    same seed gives the same arrivals, and the same pattern scaled by
    ``1 / rate`` at every rate (common random numbers for rate sweeps).

    Parameters
    ----------
    rate : float
        Mean arrivals per second.
    requests : int, optional
        At most this many arrivals.
    duration : float, optional
        Only arrivals before ``duration`` seconds. At least one of
        ``requests`` and ``duration`` is required.
    seed : int

    Returns
    -------
    numpy.ndarray of float

    Examples
    --------
    >>> at = poisson_schedule(100.0, requests=2000, seed=1)
    >>> len(at), float(at[0]), round(float(np.diff(at).mean()), 2)
    (2000, 0.0, 0.01)
    """
    rate = positive_number("rate", rate, LoadError)
    if requests is None and duration is None:
        raise LoadError("give requests and/or duration: an open loop must be bounded")
    if requests is not None:
        requests = positive_int("requests", requests, LoadError)
    if duration is not None:
        duration = positive_number("duration", duration, LoadError)
    if requests is None:
        # Expected count plus 8 standard deviations: one draw nearly always suffices.
        expected = rate * duration
        if expected > MAX_REQUESTS:
            raise LoadError(f"rate * duration = {expected:.0f} requests exceeds the limit of {MAX_REQUESTS}")
        want = int(expected + 8 * math.sqrt(expected) + 16)
    else:
        if requests > MAX_REQUESTS:
            raise LoadError(f"{requests} requests exceed the limit of {MAX_REQUESTS}")
        want = requests - 1
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, want)
    # Successive draws continue one stream, so a longer schedule extends a shorter one.
    while requests is None and gaps.sum() < duration:
        gaps = np.concatenate((gaps, rng.exponential(1.0 / rate, want)))
    at = np.concatenate(([0.0], np.cumsum(gaps)))
    if requests is not None:
        at = at[:requests]
    if duration is not None:
        at = at[at < duration]
    return at
