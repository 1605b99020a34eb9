"""The machine: its topology (cores, SMT siblings, caches, NUMA) and what a process may use.

:class:`Topology` is a value object (:mod:`~tuna_lab.machine.topology`); each
reader that builds one has a module of its own in :mod:`~tuna_lab.machine.readers` -
:mod:`~tuna_lab.machine.readers.sysfs`
(this machine, or a Linux filesystem root as ``lstopo --input`` reads it),
:mod:`~tuna_lab.machine.readers.hwloc_xml` and :mod:`~tuna_lab.machine.readers.synthetic`
(synthetic specs and :data:`PRESETS`) - returns plain data
(:class:`~tuna_lab.machine.readers.Reading`) that a classmethod of
:class:`Topology` builds on. :func:`topology_from` turns anything a user may type
into one. :class:`Limits` (:mod:`~tuna_lab.machine.limits`) is what this
process may really use - CPUs, cgroup cpuset, CPU quota - and the CPU count
to size by; :mod:`~tuna_lab.machine.linuxfs` reads the kernel files both
rely on. :mod:`tuna_lab.machine.numa` reads a process's NUMA locality, and
:mod:`~tuna_lab.machine.procfs` when a process started and whether it still runs.
:mod:`~tuna_lab.machine.sched` reads what the scheduler did to each thread and CPU
(run-queue wait, migrations, switches, busy time, pressure, cgroup throttling), and
:mod:`~tuna_lab.machine.irqs` the interrupts each CPU serves and where each IRQ may go;
:mod:`~tuna_lab.machine.cpufreq` each CPU's clock and governor, where cpufreq exposes them.
"""

import lazy_loader as _lazy

__all__ = ["Topology", "PRESETS", "DEFAULT_COSTS", "THIS_MACHINE", "topology_from", "Limits", "check_throttling"]

__getattr__, __dir__, _ = _lazy.attach(
    __name__,
    submodules=["numa", "readers", "linuxfs", "limits", "procfs", "sched", "irqs", "cpufreq"],
    submod_attrs={
        "topology": ["Topology", "DEFAULT_COSTS"],
        "readers.synthetic": ["PRESETS"],
        "spec": ["THIS_MACHINE", "topology_from"],
        "limits": ["Limits", "check_throttling"],
    },
)
