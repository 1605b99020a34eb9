"""Interrupts: how many each CPU has served (``/proc/interrupts``) and where each IRQ may go (``/proc/irq``).

A device's interrupts run on whichever CPU its affinity names, ahead of any
thread there: on a serving CPU they are load the placement model never sees.
:func:`irq_counts` is the per-CPU total a trial takes deltas of,
:func:`irq_table` the per-line view ``tuna-lab audit`` shows, and
:func:`irq_affinity` / :func:`set_irq_affinity` read and move one IRQ (what
``audit --isolate`` does, as Red Hat tuna's ``isolate`` does).

``/proc/interrupts`` lists only the online CPUs, by name in its header
(``CPU0 CPU3`` when CPUs 1-2 are offline), so counts are mapped to CPU ids
through the header, never by column position. Lines with a single total
instead of one count per CPU (``ERR``, ``MIS``) are not per CPU and are left
out. Everything is read through :mod:`tuna_lab._files` (non-blocking, a
regular file, size-capped), so a read never hangs or grows without bound.

Examples
--------
>>> counts = irq_counts()
>>> set(counts) <= set(range(os.cpu_count())) and all(n >= 0 for n in counts.values())
True
>>> parse_interrupts("      CPU0  CPU2\\n 24:  5  7  IO-APIC 5-edge ACPI:Ged\\nERR:  0\\n")
[Irq(name='24', counts=(5, 0, 7), label='IO-APIC 5-edge ACPI:Ged')]
"""

import errno
import os
import re
from typing import NamedTuple

from .. import _files
from .._checks import MAX_CPU_ID, format_cpulist, parse_cpulist
from ..errors import BindingError, TopologyError
from .linuxfs import MAX_KERNEL_FILE, read_text

__all__ = ["Irq", "parse_interrupts", "irq_table", "irq_counts", "irq_affinity", "set_irq_affinity"]

INTERRUPTS = "/proc/interrupts"
_IRQ_DIR = "/proc/irq"
_CPU_NAME = re.compile(r"CPU(\d+)", re.ASCII)
# Only a decimal IRQ number names a /proc/irq folder; anything else ("LOC", "../x") has no affinity file.
_NUMBER = re.compile(r"\d{1,9}", re.ASCII)


class Irq(NamedTuple):
    """One line of ``/proc/interrupts``."""

    #: The first column without its colon: an IRQ number (``"24"``) or a
    #: per-CPU interrupt kind (``"LOC"``, ``"RES"``).
    name: str
    #: Interrupts served since boot, indexed by CPU id (``counts[3]`` is
    #: CPU 3's); 0 for a CPU the file does not list (offline).
    counts: tuple
    #: The rest of the line (controller, trigger, device), whitespace collapsed.
    label: str


def parse_interrupts(text, where=INTERRUPTS):
    """The per-CPU lines of a ``/proc/interrupts`` text, as :class:`Irq` values.

    Raises
    ------
    TopologyError
        The header names no CPU, or a CPU id above the supported maximum.
    """
    lines = str(text).splitlines()
    cpus = _header_cpus(lines[0] if lines else "", where)
    width = max(cpus) + 1
    out = []
    for line in lines[1:]:
        name, colon, rest = line.partition(":")
        fields = rest.split()
        if not colon or len(fields) < len(cpus) or not all(f.isdigit() for f in fields[:len(cpus)]):
            continue   # ERR/MIS (one total, not per CPU) or a line this reader does not know
        counts = [0] * width
        for cpu, field in zip(cpus, fields):
            counts[cpu] = int(field)
        out.append(Irq(name.strip(), tuple(counts), " ".join(fields[len(cpus):])))
    return out


def _header_cpus(header, where=INTERRUPTS):
    """The CPU ids a ``/proc/interrupts`` header line names, in column order."""
    names = header.split()
    cpus = [int(m.group(1)) for m in map(_CPU_NAME.fullmatch, names) if m]
    if not cpus or len(cpus) != len(names):
        raise TopologyError(f"{where}: the header names no CPUs ({header[:80]!r})")
    if max(cpus) > MAX_CPU_ID:
        raise TopologyError(f"{where}: CPU id {max(cpus)} is above {MAX_CPU_ID}")
    return cpus


def _read():
    """The text of ``/proc/interrupts``, or "" where it cannot be read."""
    try:
        return _files.read_text(INTERRUPTS, limit=MAX_KERNEL_FILE, error=TopologyError)
    except OSError:
        return ""


def irq_table():
    """Every per-CPU line of this machine's ``/proc/interrupts`` (``[]`` where it cannot be read)."""
    text = _read()
    return parse_interrupts(text) if text else []


def irq_counts():
    """Interrupts served since boot per CPU id, summed over every line of ``/proc/interrupts``.

    Only the CPUs the file lists (the online ones) are keys; ``{}`` where it cannot be read.
    """
    text = _read()
    if not text:
        return {}
    table = parse_interrupts(text)
    return {cpu: sum(irq.counts[cpu] for irq in table) for cpu in _header_cpus(text.split("\n", 1)[0])}


def irq_affinity(irq):
    """The CPUs IRQ ``irq`` may be delivered to (``/proc/irq/N/smp_affinity_list``); None where not readable.

    ``irq`` is an IRQ number as :class:`Irq` names it (``"24"``); a per-CPU
    kind (``"LOC"``) or anything else that is not a number has no affinity: None.
    """
    if not _NUMBER.fullmatch(str(irq)):
        return None
    text = read_text(os.path.join(_IRQ_DIR, str(irq), "smp_affinity_list"))
    if text is None:
        return None
    try:
        return frozenset(parse_cpulist(text, f"IRQ {irq} affinity"))
    except TopologyError:
        return None


def set_irq_affinity(irq, cpus):
    """Let IRQ ``irq`` be delivered only to ``cpus`` (writes ``/proc/irq/N/smp_affinity_list``).

    Raises
    ------
    BindingError
        ``irq`` is not an IRQ number, ``cpus`` is empty, or the kernel
        refuses: no such IRQ, not permitted (not root), a CPU that is not
        online, or an IRQ the kernel does not let move (a per-CPU or managed
        interrupt answers EIO).
    """
    if not _NUMBER.fullmatch(str(irq)):
        raise BindingError(f"IRQ {irq!r}: only a numbered IRQ has an affinity that can be set")
    try:
        ids = sorted({int(c) for c in cpus})
    except (TypeError, ValueError):
        raise BindingError(f"IRQ {irq}: CPUs must be integers, got {cpus!r}") from None
    if not ids or ids[0] < 0 or ids[-1] > MAX_CPU_ID:
        raise BindingError(f"IRQ {irq}: no valid CPUs given ({cpus!r})")
    path = os.path.join(_IRQ_DIR, str(irq), "smp_affinity_list")
    text = format_cpulist(ids)
    # A procfs attribute is written in place: a temporary file and a rename (_files.write_atomic)
    # cannot replace it. The path is built from a checked number under /proc, so it cannot lead elsewhere.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        refused = "not permitted (root only; a managed IRQ is the kernel's to place)"
        why = {errno.ENOENT: "no such IRQ", errno.EACCES: refused, errno.EPERM: refused,
               errno.EROFS: "not permitted (read-only /proc)",
               errno.EIO: "the kernel does not let this IRQ move (per-CPU or managed)",
               errno.EINVAL: "the kernel refuses these CPUs (offline, or none it may deliver to)"}
        raise BindingError(f"IRQ {irq}: cannot set its affinity to {text}: "
                           f"{why.get(exc.errno, exc.strerror or exc)}") from None
