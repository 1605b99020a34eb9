"""A machine's fingerprint: the same string for the same CPUs, cores, caches and NUMA nodes.

A placement plan records the fingerprint of the topology it was made for, so
that applying it elsewhere is refused with a reason instead of pinning threads
to CPUs that mean something else; a sweep names its machines by it. Two
readings of one machine agree (sysfs or hwloc XML, any label numbering); a
different CPU set, SMT layout, cache sharing or NUMA split gives another
fingerprint. Names and cache costs are not part of it: they describe how the
machine is modelled, not which machine it is.

Examples
--------
>>> from tuna_lab.machine import Topology
>>> a = Topology.synthetic("pack:2 core:2 pu:2")
>>> fingerprint(a) == fingerprint(Topology.synthetic("pack:2 core:2 pu:2"))
True
>>> fingerprint(a) == fingerprint(Topology.synthetic("pack:1 core:4 pu:2"))
False
"""

import hashlib
import json

import numpy as np

__all__ = ["fingerprint"]


def _groups(cpus, labels):
    """The partition of ``cpus`` that ``labels`` induce, as sorted lists (independent of label values)."""
    labels = np.asarray(labels)
    return sorted(sorted(int(c) for c in cpus[labels == value]) for value in np.unique(labels))


def fingerprint(topology):
    """A 16-hex-digit digest of the topology's CPU ids and how cores, caches, packages and NUMA group them.

    Parameters
    ----------
    topology : Topology

    Returns
    -------
    str
    """
    cpus = np.asarray(topology.cpus)
    shape = {
        "cpus": [int(c) for c in cpus],
        "core": _groups(cpus, topology.core),
        "package": _groups(cpus, topology.package),
        "numa": _groups(cpus, topology.numa),
        "caches": {level: _groups(cpus, labels) for level, labels in sorted(topology.caches.items())},
    }
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
