"""The host a run happens on, in the words a manifest or a benchmark table records.

Examples
--------
>>> isinstance(cpu_model(), str)
True
"""

import os
import platform

__all__ = ["cpu_model", "describe"]


def cpu_model():
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe():
    """One line: CPU model, usable CPUs, Python and kernel (a benchmark table's caption)."""
    return (f"{cpu_model()}, {len(os.sched_getaffinity(0))} usable CPUs, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")
