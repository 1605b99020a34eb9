"""tuna_lab: static thread-to-core mapping for multi-worker CPU inference servers.

After the Tuna article: the 0-1 ILP modelled in cvxpy and solved by HiGHS,
machine topologies with cache distances, and the baselines it is compared with.

The package is a pipeline of stages, one subpackage each, importing only
downwards: :mod:`~tuna_lab.machine` (topology, limits) -> :mod:`~tuna_lab.model`
(the ILP) -> :mod:`~tuna_lab.placement` (policies, binding) -> :mod:`~tuna_lab.server`
(Gunicorn + XGBoost) -> :mod:`~tuna_lab.measure` (load, CPU, experiments) ->
:mod:`~tuna_lab.analysis` (statistics, report, advisor) -> :mod:`~tuna_lab.widgets`
and :mod:`~tuna_lab.cli`.

The names below are loaded on first use, so ``import tuna_lab`` stays cheap and
a server worker that imports a stage never loads the solver.

>>> from tuna_lab import solve, Topology
>>> mapping = solve(4, 4, Topology.preset("xeon-8272cl"))
"""

import lazy_loader as _lazy

from .errors import InfeasibleModelError, ModelError, NoSolutionError, TopologyError, TunaError

__version__ = "0.1.0"

__all__ = [
    "solve",
    "Topology",
    "TunaModel",
    "Mapping",
    "TunaError",
    "TopologyError",
    "ModelError",
    "InfeasibleModelError",
    "NoSolutionError",
]

__getattr__, __dir__, _ = _lazy.attach(__name__, submod_attrs={
    "model": ["solve", "TunaModel", "Mapping"],
    "machine": ["Topology"],
})
