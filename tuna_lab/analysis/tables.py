"""What every analysis module needs from an experiment table: its keys, defaults, checks and order.

The statistics, the figures, the report and the advisor all read the runner's
tables; they fill in the wait factors of older results, validate columns and
sort rows the same way through this module, so a table accepted (or refused,
with the same message) by one is accepted by all.

Examples
--------
>>> import pandas as pd
>>> table = with_defaults(pd.DataFrame({"model": ["large", "small"], "policy": ["tuna-scatter", "cfs"]}))
>>> sort_table(table, ["model"])[["model", "wait_policy", "spincount"]].values.tolist()
[['small', 'default', -1], ['large', 'default', -1]]
"""

import numpy as np
import pandas as pd
from pandas.api.types import is_bool_dtype, is_numeric_dtype

from ..errors import AnalysisError
from ..placement import POLICIES
from ..server.models import MODEL_FEATURES

__all__ = ["MODELS", "WAIT_FACTORS", "APPLICATION", "with_defaults", "shown_defaults", "check_table", "valid_trials",
           "ordered", "sort_table"]

#: Model sizes in the article's order (used to sort tables and figures).
MODELS = tuple(MODEL_FEATURES)

#: How the OpenMP threads wait: factors of an application beyond W, T, cores, model and batch.
WAIT_FACTORS = ("wait_policy", "spincount")

#: The columns that name one application. The wait factors are among them:
#: cells that differ only by how the threads wait must never be averaged together.
APPLICATION = ("workers", "threads", "cpus", "model", "batch") + WAIT_FACTORS


def with_defaults(table):
    """``table`` with the wait factors the runner records, at their defaults where absent.

    ``wait_policy`` "default" and ``spincount`` -1 (the runtime's own): results
    older than these factors, a sweep mixing old and new cells, and hand-made
    tables still analyse. Anything but a DataFrame is returned as is, for
    :func:`check_table` to refuse with a clear message.

    Parameters
    ----------
    table : pandas.DataFrame

    Returns
    -------
    pandas.DataFrame
        A copy with ``wait_policy`` and ``spincount`` filled in.

    Examples
    --------
    >>> import pandas as pd
    >>> with_defaults(pd.DataFrame({"spincount": [1000, None]})).values.tolist()
    [[1000, 'default'], [-1, 'default']]
    """
    if not isinstance(table, pd.DataFrame):
        return table
    wait = table["wait_policy"].fillna("default") if "wait_policy" in table.columns else "default"
    spin = table["spincount"].fillna(-1).astype(np.int64) if "spincount" in table.columns else -1
    return table.assign(wait_policy=wait, spincount=spin)


def shown_defaults(table):
    """``table`` as a reader sees it: every unset wait factor written "default", and "wait policy" in words.

    :func:`with_defaults` stores the runtime's own spin count as -1 (a
    number, so that the column sorts and compares); a table shown to a
    reader says "default" for it, as it does for the wait policy.

    Examples
    --------
    >>> import pandas as pd
    >>> shown_defaults(pd.DataFrame({"wait_policy": ["passive", None], "spincount": [1000, -1]})).values.tolist()
    [['passive', '1000'], ['default', 'default']]
    """
    out = table.copy()
    if "spincount" in out.columns:
        out["spincount"] = out["spincount"].astype(object).map(_spin_shown)
    if "wait_policy" in out.columns:
        out["wait_policy"] = out["wait_policy"].astype(object).where(out["wait_policy"].notna(), "default")
    return out.rename(columns={"wait_policy": "wait policy"})


def _spin_shown(value):
    """One spin count as a reader reads it: "default" for the runtime's own (-1 or unset), else the number."""
    if pd.isna(value):
        return "default"
    number = pd.to_numeric(value, errors="coerce")
    if pd.isna(number):
        return str(value)
    return "default" if number == -1 else str(int(number))


def check_table(table, name, columns, numeric=(), keys=()):
    """Raise :class:`~tuna_lab.errors.AnalysisError` unless ``table`` is a non-empty frame with ``columns``.

    Parameters
    ----------
    table : object
        What the caller was given.
    name : str
        The table's name in the message (``"requests"``, ``"trials"``, ...).
    columns : sequence of str
        Columns it must have.
    numeric : sequence of str
        Columns that must be numeric (not bool).
    keys : sequence of str
        Columns that must have no missing value.

    Examples
    --------
    >>> import pandas as pd
    >>> check_table(pd.DataFrame({"p99": [0.1]}), "trials", ("policy", "p99"))
    Traceback (most recent call last):
    ...
    tuna_lab.errors.AnalysisError: trials table is missing column(s): policy
    """
    if not isinstance(table, pd.DataFrame):
        raise AnalysisError(f"{name} must be a pandas DataFrame, not {type(table).__name__}")
    missing = [c for c in columns if c not in table.columns]
    if table.empty:
        raise AnalysisError(f"{name} table is empty")
    if missing:
        raise AnalysisError(f"{name} table is missing column(s): {', '.join(missing)}")
    bad = [c for c in numeric if not is_numeric_dtype(table[c]) or is_bool_dtype(table[c])]
    if bad:
        raise AnalysisError(f"{name} column(s) must be numeric: {', '.join(bad)}")
    nulls = [c for c in keys if table[c].isna().any()]
    if nulls:
        raise AnalysisError(f"{name} key column(s) have missing values: {', '.join(nulls)}")


def valid_trials(trial_table):
    """Trials that count, as :func:`tuna_lab.measure.store.valid_rows` defines them (the one definition).

    ``ok``, with a p99, no worker replaced nor master restarted, and every
    worker given a fair part of the load.

    Parameters
    ----------
    trial_table : pandas.DataFrame
        Per-trial rows with ``p99`` (and ``trial_status`` when the runner wrote it).

    Returns
    -------
    pandas.Series of bool

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"p99": [0.1, None, 0.2], "trial_status": ["ok", "ok", "failed"]})
    >>> valid_trials(t).tolist()
    [True, False, False]
    """
    from ..measure.store import valid_rows

    return valid_rows(trial_table).reindex(trial_table.index, fill_value=False).astype(bool)


def ordered(values, known):
    """``values`` with the ``known`` ones first in their canonical order, then the rest sorted.

    Examples
    --------
    >>> ordered(["zeta", "tuna-scatter", "cfs"], ("cfs", "round-robin", "tuna-scatter"))
    ['cfs', 'tuna-scatter', 'zeta']
    """
    values = list(values)
    rest = [v for v in values if v not in known]
    try:
        rest.sort()
    except TypeError:
        rest.sort(key=str)
    return [v for v in known if v in values] + rest


def _rank_key(column):
    """A ``sort_values`` key: canonical order for ``policy``/``baseline``/``model``, natural otherwise."""
    known = {"policy": POLICIES, "baseline": POLICIES, "model": MODELS}.get(column.name)
    if known is None:
        return column
    order = ordered(column.dropna().unique(), known)
    return pd.Series(pd.Categorical(column, categories=order, ordered=True).codes, index=column.index)


def sort_table(table, columns):
    """``table`` sorted by those of ``columns`` it has: policies and models in the article's order.

    The sort is stable and the index is reset.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"policy": ["tuna-scatter", "zeta", "cfs"], "trial": [0, 1, 2]})
    >>> sort_table(t, ["policy", "no-such-column"])["policy"].tolist()
    ['cfs', 'tuna-scatter', 'zeta']
    """
    columns = [c for c in columns if c in table.columns]
    return table.sort_values(columns, key=_rank_key, kind="stable").reset_index(drop=True)
