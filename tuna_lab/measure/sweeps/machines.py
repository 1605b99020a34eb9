"""A cluster's measuring machines: the name each goes by, its folder, and what it says of itself.

:func:`describe_machine` runs on each Dask worker of a cluster sweep
(:mod:`~tuna_lab.measure.sweeps.cluster`) and says which machine it is;
:func:`machine_folder` turns the name a worker reports into the one safe
folder its cells are written to.
"""

import hashlib
import platform
import re
from importlib import metadata

from ..store import machine_name

__all__ = ["describe_machine", "machine_folder"]

# A machine's folder name: these characters only, at most this long (a hostname is at most 64).
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_FOLDER_CHARS = 64


def machine_folder(name):
    """The folder of a machine that a worker reports as ``name``: one safe path component, always.

    The one rule for every place a machine name becomes a path. A worker
    says what it likes: a name that is not made of letters, digits, ``_``,
    ``.`` and ``-`` (``"../../x"``, ``"a/b"``), that starts with a dot or a
    dash, is empty or longer than 64 characters is cut to those characters
    and given a digest of the whole name, so that two names never share a folder.

    Examples
    --------
    >>> machine_folder("node7-3fb3535c")
    'node7-3fb3535c'
    >>> machine_folder("../../x")
    'x-9cdf6a50'
    >>> "/" in machine_folder("a/b"), len(machine_folder("x" * 300)) <= 64
    (False, True)
    """
    text = "" if name is None else str(name)
    safe = _UNSAFE.sub("_", text).lstrip(".-_")
    if safe and safe == text and len(safe) <= _FOLDER_CHARS:
        return safe
    digest = hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:8]
    return f"{safe[:_FOLDER_CHARS - 9] or 'machine'}-{digest}"


def describe_machine():
    """The machine this process runs on, as a cluster sweep names and records it (run on each worker).

    Returns
    -------
    dict
        ``machine`` (its folder name), ``hostname``, ``fingerprint`` (of
        the CPUs this process may use), ``shape`` (the same without the CPU
        ids, with the CPU model, cache sizes and CPU quota:
        :func:`~tuna_lab.machine.fingerprint.shape`), ``cpu_model``,
        ``caches``, ``kernel``, ``cpus``,
        ``limits`` (:meth:`Limits.to_dict <tuna_lab.machine.limits.Limits.to_dict>`),
        ``python`` and ``tuna_lab`` (versions).

    Examples
    --------
    >>> info = describe_machine()
    >>> info["machine"] == f"{info['hostname']}-{info['fingerprint'][:8]}"
    True
    """
    from ...machine.fingerprint import fingerprint, shape
    from ...machine.host import cache_sizes, cpu_model
    from ...machine.limits import Limits
    from ...machine.topology import Topology

    topo = Topology.from_sysfs()
    limits = Limits.read()
    model, caches = cpu_model(), cache_sizes(topo.cpus)
    # What makes two machines interchangeable for a cell: everything but the CPU ids.
    same = {"cpu_model": model, "caches": caches, "quota": limits.quota, "effective_cpus": limits.effective_cpus}
    info = {"hostname": platform.node(), "fingerprint": fingerprint(topo), "shape": shape(topo, same),
            "cpu_model": model, "caches": caches, "kernel": platform.release(), "cpus": [int(c) for c in topo.cpus],
            "limits": limits.to_dict(), "python": platform.python_version(), "tuna_lab": metadata.version("tuna_lab")}
    return {"machine": machine_name(info), **info}
