"""The report's "Failed trials" section: which trials failed and why, and the requests that got no answer.

A failed trial is left out of every figure (:func:`~tuna_lab.analysis.tables.valid_trials`);
this section is where it is named, with readable heads: a status of ``-1`` is
"no response", and the worker share is a percent beside its threshold.
"""

import html

import pandas as pd

from ..measure.schema import fair_share
from ._html import table as _table
from .stats import MACHINE
from .summary import balance_note, fault_note
from .tables import sort_table

__all__ = ["failures"]


# The failed trials' columns as the table heads them (the stored names are for code, not for readers).
_FAILED_HEADS = {"n": "requests", "ok": "ok", "failed": "failed", "trial_status": "status",
                 "workers_replaced": "workers replaced", "master_restarted": "master restarted",
                 "worker_share": "least-loaded worker (% of busiest's load)"}
# What a request's status -1 means (measure.schema): the client got no answer; its error says why.
_NO_RESPONSE = "no response"


def failures(requests, trials):
    """The report's "Failed trials" section: the failed trials, why, and the failed requests by error."""
    failed = trials[trials["trial_status"].ne("ok")]
    keep = [c for c in (MACHINE, "policy", "workers", "threads", "model", "batch", "trial", "n", "ok", "failed",
                        "trial_status", "workers_replaced", "master_restarted", "worker_share", "reason")
            if c in failed.columns]
    parts = [_table(_failed_trials(sort_table(failed[keep], keep)),
                    "Requests: sent in the trial; ok and failed: how many got a 2xx answer and how many not. "
                    "Least-loaded worker: its part of the load as a share of the busiest worker's (its requests, "
                    f"else its CPU time); a trial below {fair_share():.0%} measured fewer workers than the server "
                    "has.") if not failed.empty
             else '<p class="note">No failed trials.</p>']
    note = fault_note(trials)
    if note:
        # Said apart from the table: such a trial's latencies include a replacement's start-up.
        parts.insert(0, f'<p class="note">{html.escape(note)}</p>')
    note = balance_note(trials)
    if note:
        # Counted apart too (issue 47): such a trial measured fewer workers than the server has.
        parts.insert(0, f'<p class="note">{html.escape(note)}</p>')
    bad = requests[~(requests["status"].ge(200) & requests["status"].lt(300))]
    if not bad.empty:
        errors = bad.assign(error=bad["error"] if "error" in bad.columns else "")
        errors = (errors.groupby(["policy", "status", "error"], dropna=False, observed=True).size()
                  .rename("requests").reset_index())
        errors = sort_table(errors, ["policy", "status"])
        parts.append("<h3>Failed requests by error</h3>")
        parts.append(_table(errors.assign(status=_statuses(errors["status"])),
                            f"Status: the server's HTTP answer; {_NO_RESPONSE}: the client got none (timed out, "
                            "refused or cut by the trial's deadline - the error says which)."))
    return "\n".join(parts)


def _statuses(status):
    """HTTP statuses as the table shows them: the number of an answer, :data:`_NO_RESPONSE` for none (-1).

    Examples
    --------
    >>> _statuses(pd.Series([500, -1])).tolist()
    ['500', 'no response']
    """
    return status.map(lambda v: _NO_RESPONSE if pd.isna(v) or int(v) < 0 else str(int(v)))


def _failed_trials(table):
    """The failed trials' table with readable heads, counts as integers and the worker share as a percent.

    Examples
    --------
    >>> _failed_trials(pd.DataFrame({"trial_status": ["failed"], "worker_share": [0.230769]})).iloc[0].tolist()
    ['failed', '23.1%']
    """
    table = table.copy()
    if "worker_share" in table.columns:
        # A share of the busiest worker's requests: percent, to the tenth the 25% threshold needs.
        table["worker_share"] = table["worker_share"].map(lambda v: f"{v * 100:.1f}%" if pd.notna(v) else "-")
    for column in ("n", "ok", "failed", "workers_replaced", "master_restarted"):
        if column in table.columns and pd.api.types.is_numeric_dtype(table[column]):
            table[column] = table[column].map(lambda v: str(int(v)) if pd.notna(v) else "-")
    return table.rename(columns=_FAILED_HEADS)
