"""Each CPU's frequency and governor, where the kernel's cpufreq exposes them in ``/sys``.

A latency measured at 1.2 GHz is not one measured at 3.5 GHz, and a
``powersave`` governor lets a CPU idle between requests drop its clock: a
run's manifest records, per serving CPU, ``scaling_cur_freq`` (kHz) and
``scaling_governor`` from ``/sys/devices/system/cpu/cpuN/cpufreq/``. Many
virtual machines and containers have no cpufreq at all; then each figure is
None and the reading says why, in words - never a made-up figure.

Read through :func:`~tuna_lab.machine.linuxfs.read_text` (the checked file
layer: non-blocking, regular file, size-capped), so a copied tree that
imitates ``/sys`` is read by the same code as the live machine.

Examples
--------
>>> reading = cpu_frequency([0])
>>> set(reading) == {"cpus", "note"} and set(reading["cpus"]["0"]) == {"khz", "governor"}
True
"""

import os

from ..errors import TopologyError
from .linuxfs import read_text

__all__ = ["CPU_DIR", "NOT_EXPOSED", "cpu_frequency", "describe_frequency"]

#: Where Linux lists its CPUs.
CPU_DIR = "/sys/devices/system/cpu"

#: The reason recorded where no CPU has a cpufreq folder (a VM, a container without it).
NOT_EXPOSED = "not exposed by this machine: no cpufreq in /sys"


def cpu_frequency(cpus, cpu_dir=CPU_DIR):
    """The current frequency (kHz) and governor of each CPU of ``cpus``, and why any is missing.

    Parameters
    ----------
    cpus : iterable of int
        The CPU ids to read (a run's serving CPUs).
    cpu_dir : str
        The folder standing for ``/sys/devices/system/cpu`` (a copied tree in tests).

    Returns
    -------
    dict
        ``{"cpus": {"<id>": {"khz": int or None, "governor": str or None}}, "note": str or None}``:
        JSON-able (string keys, as a manifest reads back). ``note`` is None when every figure was
        read; :data:`NOT_EXPOSED` when no CPU has a cpufreq folder; else one clause per CPU
        (``"CPU 1: no scaling_governor"``).

    Examples
    --------
    >>> cpu_frequency([0], cpu_dir="/no/such/dir")
    {'cpus': {'0': {'khz': None, 'governor': None}}, 'note': 'not exposed by this machine: no cpufreq in /sys'}
    """
    cpus = sorted({int(c) for c in cpus})
    out, missing, exposed = {}, [], False
    for cpu in cpus:
        folder = os.path.join(cpu_dir, f"cpu{cpu}", "cpufreq")
        if not os.path.isdir(folder):
            out[str(cpu)] = {"khz": None, "governor": None}
            missing.append(f"CPU {cpu}: no cpufreq folder")
            continue
        exposed = True
        text, governor = (_read(folder, name) for name in ("scaling_cur_freq", "scaling_governor"))
        khz = _khz(text)
        out[str(cpu)] = {"khz": khz, "governor": governor or None}
        if khz is None:
            missing.append(f"CPU {cpu}: " + ("no scaling_cur_freq" if text is None else
                                              f"scaling_cur_freq is no frequency ({text[:20]!r})"))
        if not governor:
            missing.append(f"CPU {cpu}: no scaling_governor")
    if cpus and not exposed:
        return {"cpus": out, "note": NOT_EXPOSED}
    return {"cpus": out, "note": "; ".join(missing) or None}


def _read(folder, name):
    """The text of the cpufreq file ``name``; None where it is missing or no regular file (a copied tree)."""
    try:
        return read_text(os.path.join(folder, name))
    except TopologyError:
        return None


def _khz(text):
    """A positive integer of kHz from a ``scaling_cur_freq`` text; None for anything else (unreadable, junk)."""
    if text is None or not text.isdigit():
        return None
    value = int(text)
    return value if 0 < value < 10**9 else None     # 1 THz: no CPU's clock; a larger figure is junk


def describe_frequency(reading):
    """One line of a :func:`cpu_frequency` reading, as a report shows it.

    Examples
    --------
    >>> describe_frequency({"cpus": {"0": {"khz": 2400000, "governor": "performance"}}, "note": None})
    'CPU 0 2.40 GHz performance'
    >>> describe_frequency({"cpus": {"0": {"khz": None, "governor": None}}, "note": NOT_EXPOSED})
    'not exposed by this machine: no cpufreq in /sys'
    """
    cpus = reading.get("cpus") if isinstance(reading, dict) else None
    if not isinstance(cpus, dict):
        return "not recorded"
    parts = []
    for cpu, entry in cpus.items():
        entry = entry if isinstance(entry, dict) else {}
        khz, governor = entry.get("khz"), entry.get("governor")
        khz = khz if isinstance(khz, int) and not isinstance(khz, bool) else None
        if khz is not None or governor:
            clock = "-" if khz is None else f"{khz / 1e6:.2f} GHz"
            parts.append(f"CPU {cpu} {clock} {governor or '-'}")
    note = reading.get("note")
    if note == NOT_EXPOSED or not parts:
        return str(note or "not recorded")
    return ", ".join(parts) + (f" ({note})" if note else "")
