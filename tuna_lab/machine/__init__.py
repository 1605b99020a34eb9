"""The machine: its topology (cores, SMT siblings, caches, NUMA) and what a process may use.

:class:`Topology` is a value object; the readers that build one (sysfs,
hwloc XML, synthetic specs and presets) are its classmethods, and
:func:`topology_from` turns anything a user may type into one.
:mod:`tuna_lab.machine.numa` reads a process's NUMA locality.
"""

import lazy_loader as _lazy

__all__ = ["Topology", "PRESETS", "DEFAULT_COSTS", "THIS_MACHINE", "topology_from"]

__getattr__, __dir__, _ = _lazy.attach(__name__, submodules=["numa"], submod_attrs={
    "topology": ["Topology", "PRESETS", "DEFAULT_COSTS"],
    "spec": ["THIS_MACHINE", "topology_from"],
})
