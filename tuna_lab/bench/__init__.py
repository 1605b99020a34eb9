"""The benchmarks behind ``tuna-lab bench`` and ``make bench``: the targets, measured.

:mod:`~tuna_lab.bench.solver` times the model on the article's grid and on
many-core machines, :mod:`~tuna_lab.bench.load` sets the load generator beside
Debian's ``wrk``, and :mod:`~tuna_lab.bench.tune` sets ``tune``'s race beside an
exhaustive search.
"""
