"""Analysis as the article does it: statistics, figures, the HTML report, and the advisor.

:mod:`~tuna_lab.analysis.stats` turns per-request records into per-trial and
per-scenario p99s and speedups, :mod:`~tuna_lab.analysis.summary` gives a
run's summary (the tables ``tuna-lab run`` prints) as DataFrames,
:mod:`~tuna_lab.analysis.figures` draws them,
:mod:`~tuna_lab.analysis.mechanism` reduces the scheduler's evidence per
policy (run-queue wait, migrations, preemptions, foreign load) and relates it
to p99, :mod:`~tuna_lab.analysis.report` writes the report, and
:mod:`~tuna_lab.analysis.advise` answers "should I pin?". All of them read the
runner's tables through :mod:`~tuna_lab.analysis.tables` (keys, defaults,
checks, the article's order of policies and models).
"""

import lazy_loader as _lazy

__all__ = ["trial_stats", "scenario_stats", "speedups", "speedup_summary", "compare_policies", "cpu_cost",
           "summarize", "RunSummary", "write_report", "mechanism_table", "mechanism_correlations"]

__getattr__, __dir__, _ = _lazy.attach(__name__,
                                       submodules=["tables", "stats", "summary", "figures", "report", "advise",
                                                   "mechanism"],
                                       submod_attrs={
    "stats": ["trial_stats", "scenario_stats", "speedups", "speedup_summary", "compare_policies", "cpu_cost"],
    "summary": ["summarize", "RunSummary"],
    "report": ["write_report"],
    "mechanism": ["mechanism_table", "mechanism_correlations"],
})
