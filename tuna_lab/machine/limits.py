"""What this process may really use of the machine: CPUs, cgroup cpuset, CPU quota, isolated CPUs.

``os.sched_getaffinity`` lists the CPUs a process may run on, but not how
much CPU time it gets: on Binder, or in a Kubernetes pod with a CPU limit,
the process sees the whole node while a CFS quota lets it run, say, one
CPU's worth per period. A tool that sized itself by affinity would then start
many workers whose threads wait for quota, and measure throttling instead of
placement. :class:`Limits` gathers everything that bounds the process, and
:attr:`Limits.effective_cpus` is the count to size by.

Examples
--------
>>> import os
>>> limits = Limits.read()
>>> set(limits.usable) <= os.sched_getaffinity(0)
True
>>> Limits(online=(0, 1, 2, 3), quota=1.5).effective_cpus
1
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from .._checks import format_cpulist, parse_cpulist
from ..errors import ThrottlingWarning, TunaError
from .linuxfs import cgroup_cpu_quota, cgroup_cpuset, online_cpus, read_text

__all__ = ["Limits", "check_throttling"]

_CPU_DIR = "sys/devices/system/cpu"


@dataclass(frozen=True)
class Limits:
    """The CPUs a process may use and how much CPU time it may take.

    Attributes
    ----------
    online : tuple of int
        CPUs the kernel has online (``/sys/devices/system/cpu/online``).
    affinity : tuple of int or None
        CPUs the process may run on (``os.sched_getaffinity``); None when
        read from a copied filesystem root, which has no process.
    cpuset : tuple of int or None
        CPUs its cgroup cpuset allows (v2 ``cpuset.cpus.effective``, v1
        ``cpuset.cpus``); None if no cpuset is found.
    quota : float or None
        CFS quota in CPUs' worth of time per period (v2 ``cpu.max``, v1
        ``cpu.cfs_quota_us / cpu.cfs_period_us``, the tightest of the cgroup
        and its ancestors): ``1.5`` lets the process run 1.5 CPUs at once on
        average; None is no quota.
    isolated : tuple of int
        CPUs taken from the scheduler's load balancing (``isolcpus``,
        ``/sys/devices/system/cpu/isolated``).
    nohz_full : tuple of int
        CPUs without the periodic tick when one task runs (``nohz_full``).

    Examples
    --------
    >>> Limits(online=(0, 1, 2, 3), affinity=(0, 1, 2), cpuset=(1, 2, 3)).usable
    (1, 2)
    """

    online: tuple = ()
    affinity: tuple | None = None
    cpuset: tuple | None = None
    quota: float | None = None
    isolated: tuple = ()
    nohz_full: tuple = ()

    @property
    def usable(self) -> tuple:
        """CPUs the process may run on: online, in its affinity and in its cgroup cpuset.

        Isolated CPUs are kept: the scheduler does not balance load onto
        them, but a thread pinned there runs there - which is what a placement does.
        """
        cpus = set(self.online)
        for allowed in (self.affinity, self.cpuset):
            if allowed is not None:
                cpus &= set(allowed)
        return tuple(sorted(cpus))

    @property
    def effective_cpus(self) -> int:
        """The number of CPUs to size workers and threads by.

        ``len(usable)``, capped by the quota rounded down (at least 1) when
        there is one: ``floor(quota)`` CPUs can run without waiting for quota
        at the end of each period, and one more would already measure
        throttling. With no quota, every usable CPU.

        Examples
        --------
        >>> Limits(online=tuple(range(8)), quota=2.5).effective_cpus
        2
        >>> Limits(online=tuple(range(8)), quota=0.5).effective_cpus, Limits(online=(0, 1)).effective_cpus
        (1, 2)
        """
        n = len(self.usable)
        if self.quota is None:
            return n
        return min(n, max(1, math.floor(self.quota + 1e-9)))

    def throttles(self, n_cpus) -> bool:
        """Whether running ``n_cpus`` CPUs at once exceeds the quota (so threads wait for quota, not cores).

        Examples
        --------
        >>> Limits(online=(0, 1, 2, 3), quota=1.5).throttles(2), Limits(online=(0, 1)).throttles(2)
        (True, False)
        """
        return self.quota is not None and self.quota < n_cpus - 1e-9

    def describe(self) -> str:
        """One or two lines for ``tuna-lab topology``.

        Examples
        --------
        >>> print(Limits(online=(0, 1, 2, 3), affinity=(0, 1, 2, 3), quota=1.5).describe())
        limits: 4 usable CPUs (0-3), CPU quota 1.5 CPUs -> size by 1 CPU
          online 0-3, affinity 0-3, no cgroup cpuset, isolated none, nohz_full none
        """
        quota = "no CPU quota" if self.quota is None else f"CPU quota {self.quota:g} CPUs"
        n = self.effective_cpus
        first = (f"limits: {len(self.usable)} usable CPUs ({format_cpulist(self.usable) or 'none'}), {quota}"
                 f" -> size by {n} CPU{'' if n == 1 else 's'}")

        def cpus(value, missing):
            return missing if value is None else (format_cpulist(value) or "none")

        second = (f"  online {cpus(self.online, 'none')}, affinity {cpus(self.affinity, 'unknown')}, "
                  f"{'no cgroup cpuset' if self.cpuset is None else 'cpuset ' + cpus(self.cpuset, '')}, "
                  f"isolated {cpus(self.isolated, 'none')}, nohz_full {cpus(self.nohz_full, 'none')}")
        return f"{first}\n{second}"

    def to_dict(self) -> dict:
        """A JSON-able copy, ``usable`` and ``effective_cpus`` included.

        Examples
        --------
        >>> Limits(online=(0, 1), quota=1.5).to_dict()["effective_cpus"]
        1
        """
        out = {key: (list(value) if isinstance(value, tuple) else value) for key, value in asdict(self).items()}
        return {**out, "usable": list(self.usable), "effective_cpus": self.effective_cpus}

    @classmethod
    def read(cls, root="/", affinity=None) -> "Limits":
        """The limits of this process (``root="/"``) or of the process a filesystem root was copied from.

        Parameters
        ----------
        root : str or path, default "/"
            The filesystem root: ``root/sys/devices/system/cpu`` for the
            online and isolated CPUs, ``root/proc/self/cgroup`` and the
            cgroup mounts for the cpuset and the quota (see
            :mod:`tuna_lab.machine.linuxfs`).
        affinity : iterable of int, optional
            The CPUs the process may run on; by default ``os.sched_getaffinity(0)``
            for the live root and unknown (None) for any other.

        Examples
        --------
        >>> limits = Limits.read("/")
        >>> limits.effective_cpus <= len(limits.usable)
        True
        """
        root = Path(root)
        cpu_dir = root / _CPU_DIR
        live = root.resolve() == Path("/").resolve()
        if affinity is None and live:
            affinity = os.sched_getaffinity(0)
        online = tuple(online_cpus(cpu_dir)) if cpu_dir.is_dir() else ()
        return cls(online=online,
                   affinity=None if affinity is None else tuple(sorted(int(c) for c in affinity)),
                   cpuset=cgroup_cpuset(root), quota=cgroup_cpu_quota(root),
                   isolated=_cpulist_or_empty(cpu_dir / "isolated"),
                   nohz_full=_cpulist_or_empty(cpu_dir / "nohz_full"))


def check_throttling(threads, strict=False, error=TunaError, limits=None):
    """Warn (:class:`~tuna_lab.errors.ThrottlingWarning`), or with ``strict`` raise, when the quota throttles threads.

    The threads run on at most ``min(threads, usable CPUs)`` CPUs at a time;
    a CFS quota below that makes them wait for quota at the end of every
    period, so latencies (the p99 first) measure throttling, not placement.

    Parameters
    ----------
    threads : int
        Threads that may run at once (workers x threads per worker).
    strict : bool
        Raise ``error`` instead of warning.
    error : type
        The exception to raise (the caller's: ExperimentError, ServerError).
    limits : Limits, optional
        Default: this process's (:meth:`Limits.read`).

    Returns
    -------
    Limits

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = check_throttling(4, limits=Limits(online=(0, 1, 2, 3), quota=1.5))
    >>> caught[0].category.__name__, str(caught[0].message)[:45]
    ('ThrottlingWarning', 'CPU quota 1.5 CPUs is below the 4 CPUs these ')
    >>> check_throttling(4, strict=True, limits=Limits(online=(0, 1, 2, 3), quota=1.5))
    Traceback (most recent call last):
    ...
    tuna_lab.errors.TunaError: CPU quota 1.5 CPUs is below the 4 CPUs these threads run on: ...
    """
    limits = Limits.read() if limits is None else limits
    n = min(int(threads), len(limits.usable))
    if limits.throttles(n):
        message = (f"CPU quota {limits.quota:g} CPUs is below the {n} CPUs these threads run on: they will wait "
                   f"for quota, not for cores, so the latencies (the p99 first) measure CFS throttling, not "
                   f"placement; size by {limits.effective_cpus} CPU{'' if limits.effective_cpus == 1 else 's'}")
        if strict:
            raise error(message)
        # Attributed to this line, not the caller's: a run and each server it starts say the same
        # thing, and Python's default filter then shows it once.
        warnings.warn(message, ThrottlingWarning, stacklevel=1)
    return limits


def _cpulist_or_empty(path):
    """The CPUs of a cpulist file; ``()`` if it is missing or says ``(null)`` (a kernel without the feature)."""
    text = read_text(path)
    return () if text in (None, "", "(null)") else parse_cpulist(text, path)
