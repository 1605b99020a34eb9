"""What a measurement means on disk and in a summary: one definition each.

The latency percentiles every summary reports are computed here, one way
(linear interpolation, numpy's and pandas' default), whether over one trial's
requests (:func:`percentiles`) or per group by the analysis (which takes
:data:`PERCENTILES`).

Examples
--------
>>> percentiles([0.1, 0.2, 0.3], prefix="server")["server_p50"]
0.2
"""

import math

import numpy as np

__all__ = ["PERCENTILES", "percentiles"]

#: The latency percentiles every summary reports.
PERCENTILES = (50, 95, 99)


def percentiles(values, prefix=""):
    """``{p50, p95, p99, mean}`` of ``values`` (NaN for each when there are none).

    Parameters
    ----------
    values : array-like of float
        Latencies in seconds (already filtered to the requests that count).
    prefix : str
        Prepended with ``_`` to every key (``"server"`` -> ``server_p99``).
    """
    values = np.asarray(values, dtype=float)
    head = f"{prefix}_" if prefix else ""
    keys = [f"{head}p{q}" for q in PERCENTILES] + [f"{head}mean"]
    if values.size == 0:
        return dict.fromkeys(keys, math.nan)
    stats = [*np.percentile(values, PERCENTILES), values.mean()]
    return {k: float(v) for k, v in zip(keys, stats)}
