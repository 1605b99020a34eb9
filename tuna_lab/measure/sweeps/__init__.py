"""Sweeps: a grid of cells measured in one folder, here or on the machines of a Dask cluster.

:mod:`~tuna_lab.measure.sweeps.local` runs the cells one after another and resumes
a folder, :mod:`~tuna_lab.measure.sweeps.article` cuts the article's design to a
time budget, and :mod:`~tuna_lab.measure.sweeps.cluster` sends each cell to a Dask
worker that owns a whole measuring machine.
"""

import lazy_loader as _lazy

__all__ = ["sweep", "article_design", "sweep_on", "connect"]

__getattr__, __dir__, _ = _lazy.attach(
    __name__, submodules=["local", "article", "cluster"],
    submod_attrs={"local": ["sweep"], "article": ["article_design"], "cluster": ["sweep_on", "connect"]})
