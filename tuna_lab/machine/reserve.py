"""CPUs kept for the load generator, and the machine that is left for the server.

A load generator running on the CPUs of the server it measures takes CPU
from the policy under test - and differently for each policy. On a machine
big enough, tuna_lab keeps it apart: :func:`reserve_client_cpus` splits the
CPUs this process may use into the generator's (:attr:`ClientCpus.cpus`) and
the server's (:attr:`ClientCpus.server`, the topology every policy then
places on: cfs's allowed set, round-robin, OpenMP's places, NUMA and the
Tuna solves all see only the CPUs left).

What is reserved is a pure function of the topology, the usable CPUs and the
user's choice:

* a cpulist (``"6-7"``) - exactly those CPUs;
* ``"none"`` - nothing, on any machine;
* nothing given - nothing on a machine with fewer than
  :data:`MIN_CPUS_TO_RESERVE` usable CPUs (the generator shares the server's
  CPUs and its cost is recorded instead); one physical core (every usable
  SMT sibling of it) on a larger one: the last core of the last package and
  NUMA node, away from CPU 0 where the kernel's own housekeeping tends to run.

Examples
--------
>>> from tuna_lab.machine import Topology
>>> split = reserve_client_cpus(topology=Topology.preset("xeon-8272cl"))
>>> split.cpulist, split.server.n_logical
('15,31', 30)
>>> reserve_client_cpus("none", topology=Topology.preset("xeon-8272cl")).cpus
()
"""

from __future__ import annotations

from dataclasses import dataclass

from .._checks import format_cpulist, parse_cpulist
from ..errors import TopologyError
from .topology import Topology

__all__ = ["ClientCpus", "reserve_client_cpus", "MIN_CPUS_TO_RESERVE"]

#: Usable CPUs from which one physical core is kept for the load generator by default.
MIN_CPUS_TO_RESERVE = 8

#: What the user may type to reserve nothing explicitly.
_NONE = "none"


@dataclass(frozen=True)
class ClientCpus:
    """The load generator's CPUs and the server's machine, as :func:`reserve_client_cpus` split them.

    Attributes
    ----------
    cpus : tuple of int
        CPUs the load generator is pinned to; ``()`` when nothing is reserved
        (the generator then shares the server's CPUs).
    server : Topology
        The machine the server places on: the usable CPUs minus :attr:`cpus`.
    how : {"given", "default", "none"}
        Chosen by the user (a cpulist), by the default rule, or ``"none"``
        asked for explicitly.
    usable : int
        The usable CPU count the default rule looked at (the effective CPUs,
        capped by a CPU quota; see :class:`~tuna_lab.machine.limits.Limits`).

    Examples
    --------
    >>> split = reserve_client_cpus("3", topology=Topology.synthetic("core:4 pu:1"))
    >>> split.cpus, split.server.cpus, split.how
    ((3,), (0, 1, 2), 'given')
    """

    cpus: tuple
    server: Topology
    how: str
    usable: int

    @property
    def reserved(self) -> bool:
        """Whether the generator has CPUs of its own."""
        return bool(self.cpus)

    @property
    def cpulist(self) -> str:
        """:attr:`cpus` as a cpulist (``"6-7"``); ``""`` when nothing is reserved."""
        return format_cpulist(self.cpus)

    def describe(self) -> str:
        """The one line a command prints about it (without a ``tuna-lab:`` prefix).

        Examples
        --------
        >>> print(reserve_client_cpus(topology=Topology.synthetic("core:2 pu:1")).describe())
        the load generator shares the server's CPUs (2 usable CPUs, fewer than 8); its own CPU use is recorded; \
reserve some with --client-cpus CPULIST
        """
        server = format_cpulist(self.server.cpus)
        if self.how == "default" and not self.reserved:
            return (f"the load generator shares the server's CPUs ({self.usable} usable CPU"
                    f"{'' if self.usable == 1 else 's'}, fewer than {MIN_CPUS_TO_RESERVE}); its own CPU use is "
                    f"recorded; reserve some with --client-cpus CPULIST")
        if self.how == "none":
            return "the load generator shares the server's CPUs (--client-cpus none); its own CPU use is recorded"
        why = (f"one physical core, reserved by default on {MIN_CPUS_TO_RESERVE}+ usable CPUs; "
               f"--client-cpus none shares them" if self.how == "default" else "--client-cpus")
        return (f"load generator on CPU{'' if len(self.cpus) == 1 else 's'} {self.cpulist} ({why}); "
                f"the server places on {server}")

    def check_threads(self, threads, error=TopologyError):
        """Raise ``error`` when ``threads`` per worker cannot run on the server's CPUs because of the reservation.

        A worker's OpenMP pool is capped at the CPUs the worker may use
        (XGBoost runs ``min(nthread, omp_get_num_procs())`` threads): with
        fewer server CPUs than threads per worker, the cell would silently
        measure a smaller pool. No policy needs more (oversubscribed W x T
        share CPUs by design), so this is the only count checked.

        Examples
        --------
        >>> split = reserve_client_cpus("1", topology=Topology.synthetic("core:2 pu:1"))
        >>> split.check_threads(2)
        Traceback (most recent call last):
        tuna_lab.errors.TopologyError: 2 threads per worker need 2 CPUs, but reserving CPU 1 for the load \
generator leaves the server 1 (0): reserve fewer (--client-cpus none) or use fewer threads
        """
        left = self.server.n_logical
        if self.reserved and threads > left:
            raise error(f"{threads} threads per worker need {threads} CPUs, but reserving CPU"
                        f"{'' if len(self.cpus) == 1 else 's'} {self.cpulist} for the load generator leaves the "
                        f"server {left} ({format_cpulist(self.server.cpus)}): reserve fewer (--client-cpus none) "
                        f"or use fewer threads")
        return self

    def to_dict(self) -> dict:
        """A JSON-able record for a manifest: ``cpus``, ``cpulist``, ``how``, ``server_cpus``, ``usable``, ``note``.

        Examples
        --------
        >>> reserve_client_cpus("1", topology=Topology.synthetic("core:2 pu:1")).to_dict()["server_cpus"]
        [0]
        """
        return {"cpus": list(self.cpus), "cpulist": self.cpulist, "how": self.how,
                "server_cpus": list(self.server.cpus), "usable": self.usable, "note": self.describe()}


def reserve_client_cpus(spec=None, topology=None, limits=None, error=TopologyError):
    """Split the usable CPUs into the load generator's and the server's machine.

    Parameters
    ----------
    spec : str, iterable of int, ClientCpus or None
        A cpulist (``"6-7"``) or CPU ids: exactly those; ``"none"``: nothing;
        None: the default rule (module docstring). A :class:`ClientCpus` is
        returned as is.
    topology : Topology or str, optional
        The machine (or anything :func:`~tuna_lab.machine.topology_from` takes);
        default this one (:meth:`Topology.from_sysfs`).
    limits : Limits, optional
        What the process may use; default :meth:`Limits.read
        <tuna_lab.machine.limits.Limits.read>` for this machine, and every CPU
        of ``topology`` when a topology is given without limits (a machine
        described, not this one).
    error : type
        The exception raised on bad input (the calling command's: ExperimentError, ServerError).

    Returns
    -------
    ClientCpus

    Raises
    ------
    error
        A malformed cpulist; CPUs this process may not use; or no CPU left for the server.

    Examples
    --------
    >>> topo = Topology.preset("xeon-8260-2s")
    >>> reserve_client_cpus(topology=topo).cpulist           # socket 1's last core and its sibling
    '47,95'
    >>> reserve_client_cpus("0-95", topology=topo)
    Traceback (most recent call last):
    tuna_lab.errors.TopologyError: --client-cpus 0-95 leaves no CPU for the server (usable: 0-95)
    """
    if isinstance(spec, ClientCpus):
        return spec
    from .limits import Limits

    if topology is None:
        topology = Topology.from_sysfs()
        limits = Limits.read() if limits is None else limits
    else:
        from .spec import topology_from

        topology = topology_from(topology)
    if limits is None:
        usable, count = set(topology.cpus), topology.n_logical
    else:
        usable, count = set(topology.cpus) & set(limits.usable), limits.effective_cpus
    if not usable:
        raise error(f"{topology.name}: none of its CPUs is usable by this process")
    machine = topology.restrict(usable) if usable != set(topology.cpus) else topology
    count = min(count, machine.n_logical)
    if spec is None:
        cpus = _default_core(machine) if count >= MIN_CPUS_TO_RESERVE else ()
        how = "default"
    elif isinstance(spec, str) and spec.strip().lower() == _NONE:
        cpus, how = (), "none"
    else:
        cpus, how = _given(spec, usable, error), "given"
    left = sorted(usable - set(cpus))
    if not left:
        raise error(f"--client-cpus {format_cpulist(cpus)} leaves no CPU for the server "
                    f"(usable: {format_cpulist(usable)})")
    server = machine.restrict(left) if cpus else machine
    return ClientCpus(tuple(sorted(cpus)), server, how, count)


def _given(spec, usable, error):
    """The CPU ids the user named, each usable by this process."""
    if isinstance(spec, str):
        if not spec.strip():
            raise error("--client-cpus wants a cpulist such as 1 or 6-7, or none")
        cpus = parse_cpulist(spec, "--client-cpus", error)
    else:
        try:
            cpus = tuple(int(c) for c in spec)
        except (TypeError, ValueError):
            raise error(f"client CPUs must be a cpulist or CPU ids, not {spec!r}") from None
        if not cpus or min(cpus) < 0:
            raise error(f"client CPUs must be non-negative CPU ids, got {list(spec)!r}")
    bad = sorted(set(cpus) - usable)
    if bad:
        raise error(f"--client-cpus: CPU{'' if len(bad) == 1 else 's'} {format_cpulist(bad)} "
                    f"{'is' if len(bad) == 1 else 'are'} not usable by this process (usable: {format_cpulist(usable)})")
    return tuple(sorted(set(cpus)))


def _default_core(machine):
    """Every CPU of the last physical core of the last package and NUMA node, never CPU 0's core.

    Labels are dense by first appearance along the CPU ids, so the largest
    (package, NUMA node, core) is the one reached last.
    """
    import numpy as np

    keys = sorted({(int(p), int(n), int(c)) for p, n, c in zip(machine.package, machine.numa, machine.core)},
                  reverse=True)
    cpus = np.asarray(machine.cpus)
    for _, _, core in keys:
        chosen = tuple(cpus[machine.core == core].tolist())
        if 0 not in chosen:
            return chosen
    return ()
