"""The host a run happens on, in the words a manifest or a benchmark table records.

Examples
--------
>>> isinstance(cpu_model(), str)
True
"""

import contextlib
import os
import platform

from .._files import read_text

__all__ = ["cpu_model", "cache_sizes", "describe"]


def cpu_model():
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        for line in read_text("/proc/cpuinfo", limit=16 * 1024 * 1024).splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_sizes(cpus, root="/sys/devices/system/cpu"):
    """The distinct caches (level, type, size) of ``cpus`` as sorted strings, read from sysfs (empty if hidden).

    Examples
    --------
    >>> cache_sizes([0], root="/nonexistent")
    []
    """
    found = set()
    for cpu in cpus:
        folder = os.path.join(root, f"cpu{int(cpu)}", "cache")
        with contextlib.suppress(OSError):
            for index in os.listdir(folder):
                with contextlib.suppress(OSError):
                    parts = []
                    for name in ("level", "type", "size"):
                        parts.append(read_text(os.path.join(folder, index, name), limit=4096).strip())
                    found.add("L{} {} {}".format(*parts))
    return sorted(found)


def describe():
    """One line: CPU model, usable CPUs, Python and kernel (a benchmark table's caption)."""
    return (f"{cpu_model()}, {len(os.sched_getaffinity(0))} usable CPUs, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")
