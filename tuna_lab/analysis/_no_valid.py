"""The cells a report cannot use because not one of their trials is valid, each with why.

Issue 46: no result is dropped without a word. A cell whose every trial
failed has no p99 to show, so every table and average of a report lacks it;
``report`` names each such cell, in the report and on stderr, with the first
failed trial's reason.
"""

import os

import pandas as pd

from .._checks import printable
from ..measure import schema
from ..measure.readable import read_table
from ..measure.store import passed_over, valid_rows


def cells_without_valid_trial(results, trials=None):
    """``{cell: why}`` of the cells under ``results`` that have no valid trial, in name order.

    Two kinds, both left out of every figure: the cells the readers pass
    over (:func:`~tuna_lab.measure.store.passed_over`: their manifest counts
    no valid trial), and cells that were read but of whose rows in
    ``trials`` (the loaded trials table) none is valid. A policy with no
    valid trial in a cell whose other policies have some is named too, as
    ``"CELL (POLICY)"``: its speedup is missing from every table.

    Parameters
    ----------
    results : str or os.PathLike
        The results folder given to ``report`` (a cell, a sweep or a cluster sweep).
    trials : pandas.DataFrame, optional
        The trials of the cells read from it (:func:`~tuna_lab.measure.store.load_cells`); none when none was.

    Examples
    --------
    >>> cells_without_valid_trial("tests/data/tune-loaded")    # doctest: +ELLIPSIS
    {'w1-t2-medium-b100': 'all 6 trials failed; the first: 11 of 28 requests failed (39.3%, ...): timeout'}
    """
    results = os.fspath(results)
    out = {}
    for cell in passed_over(results):
        table, unreadable = read_table(os.path.join(cell, schema.TRIALS), "trials")
        out[_name(cell, results)] = why_no_valid(table) if unreadable is None else printable(unreadable)
    if trials is not None and len(trials) and "cell" in trials.columns:
        keys = ["machine", "cell"] if "machine" in trials.columns else ["cell"]
        valid = valid_rows(trials).reindex(trials.index, fill_value=False).astype(bool)
        for key, rows in trials.groupby(keys, sort=True, dropna=False):
            name = printable("/".join(map(str, key if isinstance(key, tuple) else (key,))), 200)
            if not valid[rows.index].any():
                out[name] = why_no_valid(rows)
            elif "policy" in rows.columns:
                # A policy of a cell with others valid: its speedup is missing from every table, so it is named.
                for policy, mine in rows.groupby("policy", sort=True):
                    if not valid[mine.index].any():
                        out[f"{name} ({printable(policy, 100)})"] = why_no_valid(mine)
    return dict(sorted(out.items()))


def counted(left_out):
    """How many cells, and policies of a cell (``"CELL (POLICY)"`` keys), ``left_out`` names, in words.

    Examples
    --------
    >>> counted({"w1-t1": "...", "w2-t1 (cfs)": "..."}), counted({"w1-t1": "...", "w2-t1": "..."})
    ('1 cell and 1 policy of a cell', '2 cells')
    >>> counted({"w2-t1 (cfs)": "...", "w2-t2 (cfs)": "..."})
    '2 policies of a cell'
    """
    policies = sum(1 for cell in left_out if str(cell).endswith(")"))
    cells = len(left_out) - policies
    parts = [f"{cells} cell{'s' * (cells != 1)}"] * bool(cells or not policies)
    parts += [f"{policies} polic{'ies' if policies != 1 else 'y'} of a cell"] * bool(policies)
    return " and ".join(parts)


def why_no_valid(trials):
    """Why no row of one cell's ``trials`` is valid, in one line: how many failed, and the first one's reason.

    Examples
    --------
    >>> why_no_valid(pd.DataFrame({"trial_status": ["failed", "failed"], "reason": ["", "port in use"]}))
    'all 2 trials failed; the first: port in use'
    >>> why_no_valid(pd.DataFrame({"trial_status": ["ok"], "p99": [None]}))
    'no trial is valid (1 trial); the first: no p99'
    """
    if trials is None or not len(trials):
        return f"{schema.TRIALS} has no rows"
    status = trials["trial_status"].fillna("ok").astype(str) if "trial_status" in trials.columns else None
    failed = status is not None and status.ne("ok").all()
    head = f"all {len(trials)} trials failed" if failed and len(trials) > 1 else \
        "its one trial failed" if failed else f"no trial is valid ({len(trials)} trial{'s' * (len(trials) > 1)})"
    # The reason is what a trials file holds: another user's file may hold terminal escapes or a megabyte.
    return f"{head}; the first: {printable(_first_reason(trials, status))}"


def _first_reason(trials, status):
    """The reason of the first row that gives one; else what about the first row makes it not valid."""
    if "reason" in trials.columns:
        reasons = trials["reason"].fillna("").astype(str).str.strip()
        if status is not None:
            reasons = reasons[status.ne("ok")]
        if reasons.ne("").any():
            return reasons[reasons.ne("")].iloc[0]
    row = trials.iloc[0]
    if status is not None and status.iloc[0] != "ok":
        return f"status {status.iloc[0]}, no reason recorded"
    for column in schema.FAULT_COLUMNS:
        if column in trials.columns and pd.to_numeric(row[column], errors="coerce") > 0:
            return f"{column} {row[column]}"
    if "p99" in trials.columns and pd.isna(pd.to_numeric(row["p99"], errors="coerce")):
        return "no p99"
    return "a worker served less than its fair share of the load (worker_share)"


def _name(cell, results):
    """A cell as ``report`` names cells: relative to the results folder (its own name when it is that folder)."""
    name = os.path.relpath(cell, results)
    return printable(os.path.basename(os.path.normpath(cell)) if name == "." else name, 200)
