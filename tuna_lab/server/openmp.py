"""The OpenMP runtime's settings a server worker runs under: the wait policy.

An idle OpenMP pool thread spins before it sleeps; ``OMP_WAIT_POLICY`` and
GNU libgomp's ``GOMP_SPINCOUNT`` set for how long. Spinning costs a core that
another worker's main thread may need, so the wait policy is a factor of every
experiment (a worker pool whose idle threads busy-spin burns CPU that does not
turn into throughput). This module only names the settings and builds the
environment; it imports nothing heavy, so a Gunicorn master can use it.

Examples
--------
>>> wait_policy_env("passive")
({'OMP_WAIT_POLICY': 'PASSIVE'}, ['GOMP_SPINCOUNT'])
"""

from dataclasses import dataclass

from .._checks import non_negative_int
from ..errors import CpuAccountingError

__all__ = ["WAIT_POLICIES", "LIBGOMP_DEFAULT_WAIT", "OpenMPEnv", "wait_policy_env"]

#: Wait policies an experiment can ask for; "default" leaves the OpenMP runtime's own.
WAIT_POLICIES = ("default", "passive", "active")

#: What "default" means for the wait policy with GNU libgomp (XGBoost's OpenMP runtime on Linux).
LIBGOMP_DEFAULT_WAIT = ("OMP_WAIT_POLICY unset: an idle thread spins for GOMP_SPINCOUNT iterations "
                        "(300,000 by default, 100 when there are more threads than CPUs), then sleeps")


@dataclass(frozen=True)
class OpenMPEnv:
    """The OpenMP settings of a :class:`~tuna_lab.server.launch.Server`'s workers: ``Server(..., openmp=...)``.

    Parameters
    ----------
    places : {"cores", "threads"}
        ``OMP_PLACES`` for the ``omp-*`` policies.
    wait_policy : {"default", "passive", "active"}
        ``OMP_WAIT_POLICY`` of the workers' OpenMP pools; ``"default"`` removes
        it from the environment so libgomp's own default applies (spin, then sleep).
    spincount : int, optional
        ``GOMP_SPINCOUNT``: how long an idle libgomp thread spins before it sleeps.

    Examples
    --------
    >>> OpenMPEnv(wait_policy="passive")
    OpenMPEnv(places='cores', wait_policy='passive', spincount=None)
    """

    places: str = "cores"
    wait_policy: str = "default"
    spincount: int | None = None


def wait_policy_env(wait_policy="default", spincount=None):
    """Environment that asks libgomp for ``wait_policy`` (and ``GOMP_SPINCOUNT``).

    Returns ``(set, unset)``: variables to set, and variables to remove from an
    inherited environment so that ``"default"`` really is the runtime's default.

    Examples
    --------
    >>> wait_policy_env("passive")
    ({'OMP_WAIT_POLICY': 'PASSIVE'}, ['GOMP_SPINCOUNT'])
    >>> wait_policy_env("default", spincount=1000)
    ({'GOMP_SPINCOUNT': '1000'}, ['OMP_WAIT_POLICY'])
    """
    if wait_policy not in WAIT_POLICIES:
        raise CpuAccountingError(f"unknown wait policy {wait_policy!r}; choose from {', '.join(WAIT_POLICIES)}")
    env, unset = {}, []
    if wait_policy == "default":
        unset.append("OMP_WAIT_POLICY")
    else:
        env["OMP_WAIT_POLICY"] = wait_policy.upper()
    if spincount is None:
        unset.append("GOMP_SPINCOUNT")
    else:
        env["GOMP_SPINCOUNT"] = str(non_negative_int("spincount", spincount, CpuAccountingError))
    return env, unset
