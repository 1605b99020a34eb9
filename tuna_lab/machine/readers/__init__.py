"""The topology readers, and what each returns: a machine as plain per-core keys, before it is a Topology.

The readers (:mod:`~tuna_lab.machine.readers.sysfs`, :mod:`~tuna_lab.machine.readers.hwloc_xml`,
:mod:`~tuna_lab.machine.readers.synthetic`) find which logical cores share a physical
core, a package, a NUMA node and each cache, and return a :class:`Reading`;
:meth:`Topology.from_reading <tuna_lab.machine.topology.Topology.from_reading>`
turns it into a topology. The readers thus never import the topology module,
which imports them for its classmethods (``Topology.from_sysfs`` and the rest).

Examples
--------
>>> from tuna_lab.machine.topology import Topology
>>> reading = Reading("two cores", (0, 1, 2, 3), core=[0, 1, 0, 1], package=["p"] * 4, numa=[None] * 4)
>>> Topology.from_reading(reading).siblings()
[(0, 2), (1, 3)]
"""

from dataclasses import dataclass, field

__all__ = ["CACHE_LEVELS", "THIS_MACHINE", "Reading"]

#: The cache levels a topology may have, innermost first.
CACHE_LEVELS = ("L1", "L2", "L3", "L4")

#: The name of this machine, as read from the live sysfs (and as a topology box offers it).
THIS_MACHINE = "this machine"


@dataclass(frozen=True)
class Reading:
    """A machine as a reader found it: one key per logical core and level.

    Two logical cores belong to the same domain when their keys are equal (a
    sibling list, an XML object's number, an OS node id...), as for
    :meth:`Topology.from_keys <tuna_lab.machine.topology.Topology.from_keys>`.

    Attributes
    ----------
    name : str
    cpus : tuple of int
        OS ids of the logical cores, strictly ascending.
    core, package, numa : sequence of hashable, one per logical core
    caches : dict of str to sequence of hashable
        ``{"L1": keys, ...}`` for the levels of :data:`CACHE_LEVELS` present.
    numa_os_index : sequence of int, optional
        The OS index of each core's NUMA node, where known.
    numa_latency : tuple, optional
        ``(node ids, matrix)``: relative NUMA latencies, for
        :meth:`Topology.with_numa_latency <tuna_lab.machine.topology.Topology.with_numa_latency>`.
    relabel : dict of int to int, optional
        OS ids to rename the cores to once read (``{cpu: new id}``), as a
        synthetic PU index list or a preset's Linux numbering asks.
    """

    name: str
    cpus: tuple
    core: list
    package: list
    numa: list
    caches: dict = field(default_factory=dict)
    numa_os_index: list = None
    numa_latency: tuple = None
    relabel: dict = None
