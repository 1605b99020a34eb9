"""Whether a cell's tables can be read, and what each of its columns must hold: the readers' one check.

A reader (:func:`~tuna_lab.measure.store.load_results`, so ``report`` and
``advise``) that passes over a cell it cannot read changes every average
it prints without a word: a sweep of four applications read as three moved
the headline speedup from 1.79 to 1.35. So every cell is checked before it
is read - its tables are regular files (not a FIFO, which would block the
read, a folder, a link or an empty file) that parse - and every table read
is checked for the types of the columns the analysis uses (a ``policy``
column of integers ended in a traceback deep in the statistics). The
reader then names every cell that fails, rather than leave it out.

Examples
--------
>>> import pandas as pd
>>> column_problem(pd.DataFrame({"policy": [1, 2], "p99": [0.1, 0.2]}), "trials")
'column policy holds int64, not text'
>>> column_problem(pd.DataFrame({"policy": ["cfs"], "p99": ["fast"]}), "trials") is None
False
"""

import os
import stat

import pandas as pd
from pandas.api.types import infer_dtype, is_numeric_dtype

from .._files import file_kind, open_regular
from . import schema

__all__ = ["TEXT_COLUMNS", "NUMBER_COLUMNS", "MAX_TABLE_ROWS", "column_problem", "table_file_problem", "read_table"]

class _Refused(Exception):
    """A table file that is not a regular file, said in :func:`read_table`'s words."""


#: Most rows a cell's table may hold: a cell of 100 trials of 100,000 requests under 3 policies has 30 million.
MAX_TABLE_ROWS = 50_000_000
#: Per table, the columns that hold text (a name, a status, a reason); missing values allowed.
TEXT_COLUMNS = {
    "trials": ("cell", "policy", "model", "wait_policy", "trial_status", "latency", "machine", "generator_cpus",
               "server_cpus"),
    "requests": ("cell", "policy", "model", "wait_policy", "error", "load_mode", "latency"),
    "threads": ("cell", "policy", "role", "wait_policy"),
}
#: Per table, the columns that hold numbers (counts, seconds, rates); a bool counts as a number.
NUMBER_COLUMNS = {
    "trials": ("workers", "threads", "cpus", "batch", "spincount", "trial", "order", "n", "ok", "failed",
               "wall_seconds", "p50", "p95", "p99", "mean", "throughput", "rate", "round", "step",
               *schema.CPU_COLUMNS, *(c for c in schema.GENERATOR_COLUMNS if not c.endswith("_cpus")),  # cpulists
               *schema.PHASE_COLUMNS, *schema.FAULT_COLUMNS, *schema.BALANCE_COLUMNS),
    "requests": ("request", "status", "client_seconds", "server_seconds", "trial", "order", "workers", "threads",
                 "cpus", "batch", "spincount", "sent_at", "scheduled_at", "rate", "round", "step"),
    "threads": ("pid", "slot", "threads", "cpu_seconds", "max_thread_cpu_seconds", "busy_cpu_seconds",
                "idle_cpu_seconds", "requests", "wall_seconds", "trial", "numa_node", "numa_locality"),
}


def column_problem(frame, table):
    """What is wrong with the column types of ``frame`` (the cell table ``table``), in words; None if nothing.

    Only the columns present are checked: tables written before a column
    existed are read all the same (the readers fill it in).

    Examples
    --------
    >>> column_problem(pd.DataFrame({"trial": ["one"]}), "requests")
    'column trial holds text, not numbers'
    """
    for column in TEXT_COLUMNS.get(table, ()):
        if column in frame.columns:
            kind = infer_dtype(frame[column], skipna=True)
            if kind not in ("string", "empty"):
                return f"column {column} holds {_kind(frame[column], kind)}, not text"
    for column in NUMBER_COLUMNS.get(table, ()):
        if column in frame.columns and not is_numeric_dtype(frame[column]):
            if infer_dtype(frame[column], skipna=True) != "empty":
                return f"column {column} holds {_kind(frame[column], None)}, not numbers"
    return None


def _kind(series, inferred):
    """A column's content in a word or two, for a message."""
    if is_numeric_dtype(series):
        return str(series.dtype)
    inferred = inferred or infer_dtype(series, skipna=True)
    return {"string": "text", "mixed": "mixed values", "mixed-integer": "mixed values"}.get(inferred, inferred)


def table_file_problem(path, required=True):
    """Why the table file ``path`` cannot be read, in words (None when it may be).

    Looked at with ``lstat`` before anything opens it: a FIFO would block
    the read for ever, a link may point anywhere, and an empty or missing
    file is a table that was lost. ``required`` False lets a missing file
    pass (``threads.parquet`` is absent when no trial was accounted).
    """
    name = os.path.basename(path)
    try:
        mode = os.lstat(path)
    except FileNotFoundError:
        return f"{name} is missing" if required else None
    except OSError as exc:
        return f"{name} cannot be looked at ({exc.strerror or exc})"
    if not stat.S_ISREG(mode.st_mode):
        return f"{name} is {file_kind(mode.st_mode)}, not a table file"
    if mode.st_size == 0:
        return f"{name} is empty"
    return None


def read_table(path, table, required=True):
    """``(frame, None)`` of the cell table file ``path``, or ``(None, why)``; ``(None, None)`` when absent and optional.

    ``table`` is ``"trials"``, ``"requests"`` or ``"threads"``: which column
    types (:func:`column_problem`) it must have.
    """
    why = table_file_problem(path, required)
    if why:
        return None, why
    if not os.path.lexists(path):
        return None, None
    name = os.path.basename(path)
    try:
        # The name may have been swapped for a FIFO or a link since it was looked at: opened without
        # following a link or blocking, and checked again by what was opened.
        fd = open_regular(path, follow=False, error=_Refused, name=name)
    except _Refused as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"{name} cannot be opened ({exc.strerror or exc})"
    with open(fd, "rb") as f:
        try:
            import pyarrow.parquet as pq

            rows = pq.ParquetFile(f).metadata.num_rows
            if rows > MAX_TABLE_ROWS:
                # A few kilobytes of dictionary-encoded rows can expand to more memory than the machine has.
                return None, f"{name} holds {rows:,} rows, more than the {MAX_TABLE_ROWS:,} a cell's table may have"
            f.seek(0)
            frame = pd.read_parquet(f)
        except Exception as exc:  # pyarrow raises many types for a damaged file
            return None, f"{name} does not parse ({type(exc).__name__})"
    why = column_problem(frame, table)
    if why:
        return None, f"{os.path.basename(path)}: {why}"
    return frame, None
