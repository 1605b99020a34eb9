"""tuna_lab: static thread-to-core mapping for multi-worker CPU inference servers.

After the Tuna article: the 0-1 ILP modelled in cvxpy and solved by HiGHS,
machine topologies with cache distances, and the baselines it is compared with.

>>> from tuna_lab import solve, Topology
>>> mapping = solve(4, 4, Topology.preset("xeon-8272cl"))
"""

from .errors import InfeasibleModelError, ModelError, NoSolutionError, TopologyError, TunaError
from .model import Mapping, TunaModel, solve
from .topology import Topology

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
