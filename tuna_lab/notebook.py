"""What the notebooks share: one setup call, times in milliseconds, intervals that stay positive.

Every notebook in ``notebooks/`` starts with ``from tuna_lab.notebook import
setup; setup()`` instead of a copied block of display settings. Importing this
module is cheap (pandas and plotly load when :func:`setup` runs), and it works
in any Jupyter front end, in nbval and in a plain script.

Examples
--------
>>> import pandas as pd
>>> trials = pd.DataFrame({"policy": ["cfs", "cfs", "tuna"], "p99": [0.020, 0.030, 0.025]})
>>> milliseconds(trials, ["p99"]).columns.tolist()
['policy', 'p99 ms']

Two trials of cfs, 20 and 30 ms: a Student t interval on the p99s themselves
would start at -38.5 ms; on their logarithms it starts at 1.9 ms.

>>> log_interval(trials, "policy").round(4)     # doctest: +NORMALIZE_WHITESPACE
        n  geomean     low   high
policy
cfs     2   0.0245  0.0019  0.322
tuna    1   0.0250     NaN    NaN
"""

import logging
import re

import numpy as np

from .errors import AnalysisError

__all__ = ["setup", "milliseconds", "log_interval", "lesson_progress", "RENDERER"]

#: The plotly renderer :func:`setup` makes the default: the interactive figure and its still PNG.
RENDERER = "plotly_mimetype+tuna_lab_static"

# What the copied setup block used to set: wide tables without wrapped columns or cut cells.
_PANDAS_OPTIONS = {"display.width": 120, "display.max_columns": 30, "display.max_colwidth": 100}


def setup(static_images=True):
    """Set up a notebook: pandas display options and how plotly figures are stored.

    A figure displayed afterwards becomes one output holding both the plotly
    JSON (interactive in JupyterLab, Notebook 7 and VS Code) and a still PNG
    (:func:`tuna_lab.widgets.figures.static`), which is what GitHub, the docs
    site and nbconvert show. Without kaleido or a Chrome/Chromium the figure
    stays interactive only and one warning says why. No HTML fallback is
    stored: it would load plotly.js from a CDN and hide the PNG from the
    viewers that cannot run it. The log of kaleido's browser driver is
    quieted (it logs recovered pipe reads as tracebacks, which the
    notebook would store), and so is the banner HiGHS prints at the first
    solver a process makes (a raw cvxpy solve would store it).

    Parameters
    ----------
    static_images : bool, default True
        False stores figures as plotly JSON only (faster: no browser starts).

    Examples
    --------
    >>> # skipped: changes this kernel's plotly renderer and logging
    >>> setup()                                   # doctest: +SKIP
    >>> import plotly.io as pio
    >>> pio.renderers.default                     # doctest: +SKIP
    'plotly_mimetype+tuna_lab_static'
    """
    import pandas as pd
    import plotly.io as pio

    from .widgets.figures import StaticRenderer

    for option, value in _PANDAS_OPTIONS.items():
        pd.set_option(option, value)
    # kaleido's browser driver logs a pipe read it recovers from as a traceback, which would be stored
    # in the notebook; a failure that matters raises from the drawing instead.
    logging.getLogger("choreographer").setLevel(logging.CRITICAL)
    pio.renderers["tuna_lab_static"] = StaticRenderer()
    pio.renderers.default = RENDERER if static_images else "plotly_mimetype"
    _spend_the_solver_banner()


def _spend_the_solver_banner():
    """Make this process's first HiGHS solver quietly: HiGHS prints its banner once, at the first one made.

    A notebook that solves with raw cvxpy (02a) would otherwise store
    "Running HiGHS 1.16.0 ... Copyright" under its first solve.
    """
    try:
        from .model.highs.programs import new_highs

        new_highs(quiet=True)
    except ImportError:         # no highspy (the measuring side's slim install): no banner either
        pass


# The operator's parts of a progress line: the countdown, and a wait for another measurement's CPUs.
_COUNTDOWN = re.compile(r"\s*\[~\d+ s left\]|; ~\d+ s left")
# The operator's next step in machine.reserve's note: a command-line flag, not the lesson's business.
_OPERATOR_HINT = "; reserve some with --client-cpus CPULIST"
_LOCK_WAIT = "waiting up to "


def lesson_progress(line):
    """Print a measurement's progress line for a lesson: without the operator's countdown or CPU-lock wait.

    ``run(..., progress=print)`` stores in the notebook what the command line
    tells its operator - ``[~547 s left]`` beside a lesson's "about a
    minute", ``waiting up to 3600 s (TUNA_LAB_CPU_LOCK_WAIT) ...`` - numbers
    that say how busy the machine was the day the notebook was run, and the
    command-line flag to pass next time (``reserve some with --client-cpus``).
    The wait goes to the ``tuna_lab`` logger instead (not stored unless the
    reader asks for it); the rest of the line is printed as it came.

    Examples
    --------
    >>> lesson_progress("w2-t2 trial 1/2 cfs  p99 160.8 ms  ok  [~547 s left]  CPU/req: server 54.73 ms")
    w2-t2 trial 1/2 cfs  p99 160.8 ms  ok  CPU/req: server 54.73 ms
    >>> lesson_progress("waiting up to 3600 s (TUNA_LAB_CPU_LOCK_WAIT): CPUs 0-1 in use by process 42")
    >>> lesson_progress("its own CPU use is recorded; reserve some with --client-cpus CPULIST")
    its own CPU use is recorded
    """
    if line.startswith(_LOCK_WAIT):
        logging.getLogger("tuna_lab").info(line)
        return
    print(_COUNTDOWN.sub("", line).replace(_OPERATOR_HINT, ""))


def milliseconds(frame, columns):
    """``frame`` with the time columns ``columns`` (seconds) in milliseconds, named ``"<name> ms"``.

    A trailing ``_seconds`` of a name is dropped (``server_seconds`` becomes
    ``server ms``), so that every time in a table reads in one unit.

    Parameters
    ----------
    frame : pandas.DataFrame
    columns : sequence of str
        Columns holding seconds.

    Returns
    -------
    pandas.DataFrame
        A copy; the other columns unchanged and in place.

    Raises
    ------
    AnalysisError
        If a column is missing.

    Examples
    --------
    >>> import pandas as pd
    >>> milliseconds(pd.DataFrame({"server_seconds": [0.0125], "n": [3]}), ["server_seconds"])
       server ms  n
    0       12.5  3
    """
    columns = [columns] if isinstance(columns, str) else list(columns)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise AnalysisError(f"no column {missing[0]!r} to convert to milliseconds; columns: {list(frame.columns)}")
    out = frame.copy()
    out[columns] = out[columns] * 1e3
    return out.rename(columns={c: f"{c.removesuffix('_seconds')} ms" for c in columns})


def log_interval(table, by, value="p99", confidence=0.95):
    """Geometric mean of ``value`` per group, with a Student t interval on the log scale.

    A latency is positive and skewed: an interval ``mean +- t * std / sqrt(n)``
    on two or three trials easily reaches below zero. Taken on ``log(value)``
    and mapped back with ``exp``, the interval is ``geomean */ factor``: it
    always stays above zero and is as wide in ratio above as below, which is
    how speedups are read.

    Parameters
    ----------
    table : pandas.DataFrame
        One row per observation (for a p99: per trial, as
        :func:`tuna_lab.analysis.trial_stats` gives).
    by : str or list of str
        The group keys (a scenario: ``["workers", "threads", "policy"]``, ...).
    value : str, default "p99"
        A column of positive numbers; missing and non-positive values are
        left out of ``n``.
    confidence : float, default 0.95

    Returns
    -------
    pandas.DataFrame
        Indexed by ``by``: ``n``, ``geomean``, ``low``, ``high``, in the unit
        of ``value`` (``low`` and ``high`` NaN below two observations).

    Raises
    ------
    AnalysisError
        A missing column, or ``confidence`` not in (0, 1).

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"policy": "cfs", "p99": [0.024, 0.036]})
    >>> row = log_interval(trials, "policy").loc["cfs"]
    >>> round(float(row["geomean"]), 4), bool(0 < row["low"] < 0.024), bool(row["high"] > 0.036)
    (0.0294, True, True)
    """
    from scipy import stats

    by = [by] if isinstance(by, str) else list(by)
    missing = [c for c in [*by, value] if c not in table.columns]
    if missing:
        raise AnalysisError(f"table has no column {missing[0]!r}")
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1) or isinstance(confidence, bool):
        raise AnalysisError(f"confidence must be a number in (0, 1), got {confidence!r}")
    positive = table[value].where(table[value] > 0)
    logs = np.log(positive.astype(float)).rename("log").to_frame().join(table[by])
    grouped = logs.groupby(by, sort=True)["log"].agg(["count", "mean", "std"])
    n = grouped["count"].astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        dof = np.where(n > 1, n - 1, np.nan)
        half = stats.t.ppf(0.5 + confidence / 2, dof) * grouped["std"] / np.sqrt(n)
    center = grouped["mean"]
    out = grouped.assign(n=n, geomean=np.exp(center), low=np.exp(center - half), high=np.exp(center + half))
    return out[["n", "geomean", "low", "high"]]
