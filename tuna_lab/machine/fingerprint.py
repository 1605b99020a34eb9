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

:func:`shape` forgets the CPU ids as well: two machines of one type - or two
1-CPU slices of one machine - have the same shape and different fingerprints.
"""

import hashlib
import json

import numpy as np

__all__ = ["fingerprint", "shape"]


def _groups(cpus, labels):
    """The partition of ``cpus`` that ``labels`` induce, as sorted lists (independent of label values)."""
    labels = np.asarray(labels)
    return sorted(sorted(int(c) for c in cpus[labels == value]) for value in np.unique(labels))


def fingerprint(topology):
    """A 16-hex-digit digest of the topology's CPU ids and how cores, caches, packages and NUMA group them.

    Parameters
    ----------
    topology : Topology or str
        Anything :func:`~tuna_lab.machine.topology_from` takes (a preset name, a spec).

    Returns
    -------
    str
    """
    from .spec import topology_from

    topology = topology_from(topology)
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


def _tree(rows):
    """The canonical form of CPUs described by label tuples (coarsest first): nested sorted lists of counts."""
    if not rows or not rows[0]:
        return len(rows)
    groups = {}
    for row in rows:
        groups.setdefault(row[0], []).append(row[1:])
    return sorted((_tree(members) for members in groups.values()), key=lambda t: json.dumps(t))


def shape(topology, extra=None):
    """A 16-hex-digit digest of the topology up to renaming of its CPU ids, and of ``extra``.

    Two topologies have one shape when a renumbering of the CPUs of one
    gives the other: the same packages, NUMA nodes, caches and cores, with
    the same SMT, nested the same way. ``extra`` (JSON-able: the CPU model,
    cache sizes, a CPU quota) is part of the digest, so that machines of one
    shape but another model or quota differ. A cluster sweep moves a cell
    between machines of one shape.

    Parameters
    ----------
    topology : Topology or str
        Anything :func:`~tuna_lab.machine.topology_from` takes (a preset name, a spec).
    extra : dict, optional

    Returns
    -------
    str

    Examples
    --------
    >>> from tuna_lab.machine import Topology
    >>> a = Topology.synthetic("pack:2 core:2 pu:2")
    >>> shape(a) == shape(a.relabel([7, 6, 5, 4, 3, 2, 1, 0])) != shape(Topology.synthetic("pack:1 core:4 pu:2"))
    True
    >>> shape(a, {"cpu_model": "x"}) == shape(a, {"cpu_model": "y"})
    False
    """
    from .spec import topology_from

    topology = topology_from(topology)
    cpus = np.asarray(topology.cpus)
    # Coarsest to finest; a level that does not nest in the one above still splits the tree the same way
    # whatever the ids, and each level's own group sizes are added for what nesting cannot show.
    levels = [("package", topology.package), ("numa", topology.numa)]
    levels += [(level, labels) for level, labels in sorted(topology.caches.items(), reverse=True)]
    levels += [("core", topology.core)]
    rows = [tuple(int(np.asarray(labels)[i]) for _, labels in levels) for i in range(len(cpus))]
    sizes = {name: sorted(len(g) for g in _groups(cpus, labels)) for name, labels in levels}
    text = json.dumps({"tree": _tree(rows), "sizes": sizes, "levels": [name for name, _ in levels],
                       "extra": extra or {}}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
