"""The report's HTML primitives: an escaped value, a column of numbers, a table with its note.

Shared by :mod:`~tuna_lab.analysis.report` and the sections it draws from other
modules (``analysis._failures``), so that every table of the report
reads the same way.
"""

import html

import numpy as np
import pandas as pd

from .tables import shown_defaults

__all__ = ["esc", "fmt", "table"]


def esc(value):
    return html.escape(str(value))


def fmt(values, digits=2):
    """Numbers as fixed-point strings, ``"-"`` where missing."""
    values = pd.Series(values, dtype=float)
    return values.map(lambda v: f"{v:.{digits}f}" if np.isfinite(v) else "-")


def table(frame, note=None):
    # Every unset setting reads "default" in every table (spincount is stored as -1: tables.with_defaults).
    body = shown_defaults(frame).to_html(index=False, na_rep="-", border=0, escape=True)
    return body + (f'<p class="note">{esc(note)}</p>' if note else "")
