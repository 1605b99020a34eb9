"""Should I pin? Predict each policy's p99 speedup over ``cfs`` from sweep results.

After MAO (Liu et al., "Machine learning approach for NUMA optimization in
Warehouse Scale Computers"), which predicts the gain of NUMA binding from
measurements taken *before* binding with an XGBoost regressor, compared with
a linear baseline by mean absolute error and R^2. Here the question is
thread-to-core pinning of a Gunicorn + XGBoost server, and the training data
is a ``tuna-lab sweep``:

* **one row** per configuration and pinning policy, where a *configuration*
  is ``(workers, threads, model, batch, wait_policy, spincount)`` measured on
  one machine (:mod:`~tuna_lab.analysis.advise.features`);
* **features** known before pinning: ``W``, ``T``, ``W*T/cpus``, the model's
  size (input features, trees), batch, OpenMP wait policy and spin count, the
  machine's shape (cpus, physical cores, SMT ways, L3 domains, NUMA nodes),
  the median stage times of the configuration's requests under ``cfs`` and,
  when the results have them, the ``cfs`` trials' CPU and NUMA-locality
  columns and the tail's shares of the ``cfs`` requests (waiting for a CPU,
  running, backlog, rest; of the slowest 1% and of the median requests:
  :mod:`~tuna_lab.analysis.anatomy`), and the policy (one-hot);
* **target** the policy's p99 speedup over ``cfs`` in the same configuration,
  as :func:`tuna_lab.analysis.speedups` computes it (the article's
  definition, the one ``tuna-lab report`` shows): the mean over trials of
  the ``cfs`` p99 divided by the mean over trials of the policy's p99;
* **two regressors** of ``log(speedup)`` (:mod:`~tuna_lab.analysis.advise.regressors`):
  a small XGBoost model (the advisor's) and a linear baseline (scikit-learn's
  ridge with a cross-validated penalty), beside a **constant baseline** (the
  training rows' geometric-mean speedup, whatever the features): a regressor
  no better than it on held-out configurations has learnt nothing.

All three are evaluated on held-out *configurations*
(:mod:`~tuna_lab.analysis.advise.folds`): every fold leaves whole
configurations out (all their policies), so nothing measured in a held-out
configuration is seen in training. With few configurations each is left out
once. :mod:`~tuna_lab.analysis.advise.advisor` trains and asks the
:class:`Advisor`; :mod:`~tuna_lab.analysis.advise.recommendation` holds its
answer. ``tuna-lab advise`` is :mod:`tuna_lab.cli.commands.advise`.

The names below load on first use: the CLI reads :data:`DEFAULT_RESULTS`
without loading pandas, scikit-learn or XGBoost. scikit-learn is not in the
slim install (``make demo``, ``pip install tuna_lab``): the advisor says in
one line (an :class:`~tuna_lab.errors.AdviseError`) to install the ``advise`` extra.

Examples
--------
>>> from tuna_lab.analysis.advise import train
>>> # skipped: needs a sweep's results (tuna-lab sweep --out results/sweep)
>>> advisor = train("results/sweep")                                # doctest: +SKIP
>>> advisor.evaluation[["model", "mae", "r2"]]                      # doctest: +SKIP
>>> rec = advisor.recommend(2, 2, "medium", batch=100)              # doctest: +SKIP
>>> rec.best_policy, rec.predicted_speedup, rec.pin, rec.covered    # doctest: +SKIP
"""

import os

import lazy_loader as _lazy

__all__ = ["Advisor", "Recommendation", "train", "check_question", "feature_table", "grouped_folds",
           "DEFAULT_RESULTS", "MIN_CONFIGURATIONS"]

#: Where ``tuna-lab advise`` looks for results unless given a RESULTS folder: the
#: folder the README's sweep command writes (``--out results/sweep``).
DEFAULT_RESULTS = os.path.join("results", "sweep")

__getattr__, __dir__, _ = _lazy.attach(
    __name__, submodules=["features", "regressors", "folds", "advisor", "recommendation"], submod_attrs={
        "advisor": ["Advisor", "train", "check_question", "MIN_CONFIGURATIONS"],
        "recommendation": ["Recommendation"],
        "features": ["feature_table"],
        "folds": ["grouped_folds"],
    })
