"""One way from what a user types to a :class:`~tuna_lab.machine.topology.Topology`.

The CLI's topology options, the widgets' topology box, the advisor and the
placement policies all read a machine through :func:`topology_from`, so a spec
that works in one place works in every other.

Examples
--------
>>> topology_from("core:2 pu:2").n_logical
4
"""

import os

from ..errors import TopologyError
from .readers import THIS_MACHINE
from .readers.synthetic import PRESETS
from .topology import Topology

__all__ = ["THIS_MACHINE", "topology_from"]

#: What :func:`topology_from` takes, as every refusal of a topology says it.
_ACCEPTED = (f"a Topology, None or {THIS_MACHINE!r}, a preset ({', '.join(PRESETS)}), "
             "an hwloc synthetic spec (\"core:4 pu:2\") or hwloc XML (text or an .xml path)")

def topology_from(spec):
    """A :class:`~tuna_lab.Topology` from whatever a topology box may hold.

    Parameters
    ----------
    spec : Topology, str or None
        A topology (returned as is); ``None`` or ``"this machine"``; a preset
        name; hwloc XML text or the path of an ``.xml`` file; or an hwloc
        synthetic spec (``"pack:2 l3:2 core:4 pu:2"``, optionally prefixed
        ``"synthetic:"`` as in a synthetic topology's name).

    Raises
    ------
    TopologyError
        Nothing usable could be read from ``spec``.

    Examples
    --------
    >>> topology_from("epyc-7313p").n_logical, topology_from("core:2 pu:2").n_physical
    (32, 2)
    """
    if isinstance(spec, Topology):
        return spec
    if spec is None:
        return Topology.from_sysfs()
    if not isinstance(spec, str):
        raise TopologyError(f"a topology is {_ACCEPTED}; not {type(spec).__name__} {spec!r:.40}")
    text = spec.strip()
    if text.lower() in ("", THIS_MACHINE):
        return Topology.from_sysfs()
    if text in PRESETS:
        return Topology.preset(text)
    if text.startswith("<") or (text.endswith(".xml") and os.path.exists(text)):
        return Topology.from_hwloc_xml(text)
    if ":" not in text:
        # A lone word is a mistyped preset far more often than a synthetic spec.
        raise TopologyError(f"unknown topology {text!r}: a topology is {_ACCEPTED}")
    return Topology.synthetic(text.removeprefix("synthetic:"))
