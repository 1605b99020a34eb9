"""Topologies from hwloc synthetic descriptions, and the named machines (presets).

The readers behind :meth:`Topology.synthetic
<tuna_lab.machine.topology.Topology.synthetic>` and :meth:`Topology.preset
<tuna_lab.machine.topology.Topology.preset>`. A synthetic description such as
``"pack:2 l3:2 core:4 pu:2"`` gives, level by level from the top, how many
children each object has; PUs are numbered in that order, as ``lstopo`` does.
Each preset is such a description, renumbered the way Linux numbers SMT
siblings.

Examples
--------
>>> len(read_synthetic("pack:2 core:2 pu:2").cpus)
8
>>> from tuna_lab.machine.topology import Topology
>>> Topology.from_reading(read_preset("xeon-8272cl")).siblings()[0]
(0, 16)
"""

import dataclasses
import re

import numpy as np

from ..._checks import MAX_CPU_ID, MAX_LOGICAL_CPUS, check_cpus
from ...errors import TopologyError
from . import CACHE_LEVELS, Reading

__all__ = ["PRESETS", "read_synthetic", "read_preset"]

#: The named machines :func:`read_preset` knows, with what each one models.
PRESETS = {
    "xeon-8272cl": "Azure D32ds_v4 (Tuna article): 1 socket, 16 cores, 2-way SMT, "
    "private L1/L2, one shared L3; C=32",
    "xeon-8260-2s": "2 sockets x 24 cores x 2-way SMT, private L1/L2, L3 and NUMA node "
    "per socket; C=96",
    "epyc-7313p": "1 socket, 4 CCDs x 4 cores x 2-way SMT, private L1/L2, L3 per CCD; C=32",
    "epyc-9654": "1 socket, 12 CCDs x 8 cores x 2-way SMT, private L1/L2, L3 per CCD; C=192",
    "epyc-9654-2s": "2 x epyc-9654, NUMA node per socket; C=384",
    "epyc-9965-2s": "2 sockets x 12 CCDs x 16 cores (Zen 5c) x 2-way SMT, private L1/L2, L3 per CCD, "
    "NUMA node per socket; C=768",
}

# Each preset is a synthetic spec (hwloc numbers its PUs core by core) renumbered
# the way Linux usually numbers SMT siblings: physical core x owns cpus x, x+P, ...
_PRESET_SPECS = {
    "xeon-8272cl": "pack:1 l3:1 l2:16 l1:1 core:1 pu:2",
    "xeon-8260-2s": "pack:2 numa:1 l3:1 l2:24 l1:1 core:1 pu:2",
    "epyc-7313p": "pack:1 l3:4 l2:4 l1:1 core:1 pu:2",
    "epyc-9654": "pack:1 l3:12 l2:8 l1:1 core:1 pu:2",
    "epyc-9654-2s": "pack:2 numa:1 l3:12 l2:8 l1:1 core:1 pu:2",
    "epyc-9965-2s": "pack:2 numa:1 l3:12 l2:16 l1:1 core:1 pu:2",
}

# Position of each non-NUMA synthetic level from the top; levels must appear in
# this order. NUMA nodes may sit anywhere above the PUs (per package, per L3,
# or above the packages), as on real machines.
_SYNTHETIC_RANK = {"package": 0, "L4": 1, "L3": 2, "L2": 3, "L1": 4, "core": 5, "pu": 6}

_SYNTHETIC_LEVEL = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*):(\d+)(?:\(([^()]*)\))?(?=\s|$)")
_CACHE_WORD = re.compile(r"l([1-4])([dui]?)(?:cache)?")
_ALIASES = {**dict.fromkeys(("package", "pack", "socket"), "package"),
            **dict.fromkeys(("numa", "node", "numanode"), "numa"), "core": "core", "pu": "pu"}


def read_synthetic(spec) -> Reading:
    """The :class:`~tuna_lab.machine.readers.Reading` of an hwloc synthetic description.

    Parameters
    ----------
    spec : str
        Levels ``type:arity`` from the top, the last one ``pu``; see
        :meth:`Topology.synthetic <tuna_lab.machine.topology.Topology.synthetic>`
        for the types and attributes understood.

    Raises
    ------
    TopologyError
        An empty or malformed spec, an unknown type, levels out of order, or
        more than 4096 PUs (:data:`~tuna_lab._checks.MAX_LOGICAL_CPUS`).

    Examples
    --------
    >>> read_synthetic("numa:2 core:2 pu:1").numa.tolist()
    [0, 0, 1, 1]
    """
    if not isinstance(spec, str) or not spec.strip():
        raise TopologyError(f"empty synthetic spec {spec!r}")
    levels = _parse(spec)
    n_pus = int(np.prod([arity for _, arity, _ in levels]))
    position = np.arange(n_pus)
    labels, above = {}, 1
    for kind, arity, _ in levels[:-1]:
        above *= arity
        if kind is not None:
            labels[kind] = position // (n_pus // above)
    ids = _indexes(spec, levels[-1][2], n_pus)
    zeros = np.zeros(n_pus, dtype=int)
    return Reading(f"synthetic:{' '.join(spec.split())}", tuple(range(n_pus)), labels.get("core", position),
                   labels.get("package", zeros), labels.get("numa", zeros),
                   {lv: labels[lv] for lv in CACHE_LEVELS if lv in labels},
                   relabel=None if ids is None else dict(enumerate(ids)))


def read_preset(name) -> Reading:
    """The machine ``name`` of :data:`PRESETS`: logical cores ``x`` and ``x + P`` are SMT siblings.

    Raises
    ------
    TopologyError
        ``name`` is not a preset; the message lists the presets.

    Examples
    --------
    >>> read_preset("xeon-8272cl").relabel[1]    # hwloc's PU 1, core 0's second thread
    16
    """
    if name not in _PRESET_SPECS:
        raise TopologyError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    reading = read_synthetic(_PRESET_SPECS[name])
    n_pus = len(reading.cpus)
    n_phys = len(np.unique(reading.core))
    smt = n_pus // n_phys
    # hwloc numbers PU i as thread i % smt of core i // smt; Linux as core + thread * P.
    i = np.arange(n_pus)
    linux = dict(zip(i.tolist(), (i // smt + (i % smt) * n_phys).tolist()))
    return dataclasses.replace(reading, name=name, relabel=linux)


def _parse(spec):
    """``[(kind or None, arity, attributes), ...]`` of a synthetic spec, validated."""
    levels, pos, end = [], 0, len(spec.rstrip())
    while pos < end:
        m = _SYNTHETIC_LEVEL.match(spec, pos)
        if not m:
            raise TopologyError(f"synthetic spec {spec!r}: cannot parse at {spec[pos:].strip()!r}")
        word, arity = m.group(1).lower(), int(m.group(2))
        cache = _CACHE_WORD.fullmatch(word)
        if cache:
            kind = None if cache.group(2) == "i" else f"L{cache.group(1)}"  # skip l1i
        elif word in _ALIASES:
            kind = _ALIASES[word]
        else:
            raise TopologyError(f"synthetic spec {spec!r}: unknown type {m.group(1)!r}; use "
                                "package, numa, l4, l3, l2, l1, core, pu")
        if arity < 1:
            raise TopologyError(f"synthetic spec {spec!r}: arity of {m.group(1)!r} must be positive")
        levels.append((kind, arity, m.group(3) or ""))
        pos = m.end()
    kinds = [kind for kind, _, _ in levels if kind is not None]
    if not kinds or kinds[-1] != "pu" or levels[-1][0] != "pu":
        raise TopologyError(f"synthetic spec {spec!r}: the last level must be pu")
    if len(set(kinds)) != len(kinds):
        raise TopologyError(f"synthetic spec {spec!r}: a type appears twice")
    ranked = [k for k in kinds if k != "numa"]
    for upper, lower in zip(ranked, ranked[1:]):
        if _SYNTHETIC_RANK[upper] > _SYNTHETIC_RANK[lower]:
            raise TopologyError(f"synthetic spec {spec!r}: {upper!r} cannot be below {lower!r} "
                                "(order: package, l4, l3, l2, l1, core, pu)")
    n_pus = 1
    for _, arity, _ in levels:
        # Checked level by level: the product of a long spec's arities is never computed whole.
        n_pus *= arity
        if n_pus > MAX_LOGICAL_CPUS:
            raise TopologyError(f"synthetic spec {spec!r}: more than the {MAX_LOGICAL_CPUS} PUs a topology may have")
    return levels


def _indexes(spec, attributes, n_pus):
    """OS ids from a PU level's ``indexes=`` list, or None for hwloc's default 0..C-1."""
    for attribute in attributes.split():
        if attribute.lower().startswith("indexes="):
            value = attribute.split("=", 1)[1]
            if not re.fullmatch(r"\d+(,\d+)*", value):
                raise TopologyError(f"synthetic spec {spec!r}: only explicit PU index lists "
                                    "(indexes=0,2,1,3) are supported")
            digits = value.split(",")
            # Longer than any id we accept, and int() refuses over 4300 digits: refused as text.
            big = next((x for x in digits if len(x) > len(str(MAX_CPU_ID))), None)
            if big is not None:
                raise TopologyError(f"synthetic spec {spec!r}: CPU id {big[:24]} is above {MAX_CPU_ID}")
            ids = [int(x) for x in digits]
            check_cpus(ids, f"synthetic spec {spec!r}")
            if len(ids) != n_pus or len(set(ids)) != n_pus:
                raise TopologyError(f"synthetic spec {spec!r}: indexes must list {n_pus} distinct PU ids")
            return ids
    return None
