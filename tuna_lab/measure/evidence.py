"""What a cell's manifest records of the machine's clocks and the runtimes' wait settings.

Two things change a latency without being a factor of the cell, so the
manifest records them beside the wait policy:

* ``cpu_frequency``: per serving CPU, the frequency (kHz) and governor the
  kernel's cpufreq shows (:func:`~tuna_lab.machine.cpufreq.cpu_frequency`),
  read when the cell starts (``start``) and when its last trial ends
  (``end``); where the machine exposes no cpufreq each figure is null and
  ``note`` says why.
* ``wait_knobs``: how long an idle pool thread of each runtime the project
  places spins before it sleeps - ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT``
  (GNU libgomp), ``KMP_BLOCKTIME`` (Intel and LLVM OpenMP) and ONNX Runtime's
  ``session.intra_op.allow_spinning`` - as the server was started with them;
  ``"default"`` for one left unset (the runtime's own). ``wait_knobs_note``
  says what cannot be seen from outside.

Examples
--------
>>> from tuna_lab.measure.experiment import Config
>>> knobs = wait_knobs(Config(1, 1, "small", 10, wait_policy="passive"), environ={"KMP_BLOCKTIME": "0"})
>>> knobs["OMP_WAIT_POLICY"], knobs["GOMP_SPINCOUNT"], knobs["KMP_BLOCKTIME"], knobs[ORT_SPINNING]
('PASSIVE', 'default', '0', 'default')
"""

import os
from collections.abc import Mapping

from ..machine import procfs
from ..machine.cpufreq import cpu_frequency, describe_frequency
from ..server.openmp import wait_policy_env

__all__ = ["WAIT_KNOBS", "ORT_SPINNING", "DEFAULT", "wait_knobs", "wait_knobs_note", "server_evidence",
           "evidence_rows"]

#: ONNX Runtime's session option that lets its intra-op pool spin after a parallel section.
ORT_SPINNING = "session.intra_op.allow_spinning"
#: The wait settings recorded, in order: libgomp's two, Intel/LLVM OpenMP's, ONNX Runtime's.
WAIT_KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", ORT_SPINNING)
#: What a setting left to its runtime reads as, in the manifest and every table (as the wait policy does).
DEFAULT = "default"
#: The knobs that are factors of a cell (:class:`~tuna_lab.measure.experiment.Config`): they differ per cell.
_CELL_FACTORS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# ONNX Runtime reads its spinning option from the session options the app's code makes, not from the environment.
_ORT_APP = "the app's own SessionOptions (not visible outside the worker)"


def wait_knobs(config, target=None, environ=None):
    """The wait settings the server of ``config`` (and ``target``) runs under: ``{name: value or "default"}``.

    Parameters
    ----------
    config : Config
        The cell; for the lab server its wait policy and spin count are applied
        as :class:`~tuna_lab.server.launch.Server` applies them.
    target : Target, optional
        The measured target: an app's extra environment is added to
        ``environ``; a running server's is read from its master
        (``/proc/PID/environ``).
    environ : mapping, optional
        The environment the server inherits (default this process's).

    Returns
    -------
    dict
        One entry per :data:`WAIT_KNOBS`. The ONNX Runtime option is set in an
        app's code: ``"default"`` for the lab server (which creates no ONNX
        Runtime session), else a phrase saying it is the app's own.
    """
    kind = getattr(target, "kind", None) or getattr(config, "target", "lab")
    env = dict(os.environ if environ is None else environ)
    if kind == "attached" and getattr(target, "master", None) is not None:
        try:
            env = procfs.environ(target.master)
        except OSError as exc:
            return {name: f"unreadable: {exc.strerror or exc}" for name in WAIT_KNOBS}
    env.update(getattr(target, "env", None) or {})
    if kind == "lab":
        wait_set, wait_unset = wait_policy_env(config.wait_policy, config.spincount)
        for name in wait_unset:
            env.pop(name, None)
        env.update(wait_set)
    out = {name: env.get(name) or DEFAULT for name in WAIT_KNOBS[:3]}
    out[ORT_SPINNING] = DEFAULT if kind == "lab" else _ORT_APP
    return out


def wait_knobs_note(kind):
    """Why the wait settings of a ``kind`` target read as they do (one sentence)."""
    where = ("the environment the lab server was started with" if kind == "lab" else
             "the running server's master's environment" if kind == "attached" else
             "the environment the app's server was started with")
    return (f"From {where}; 'default' is a variable left unset (the runtime's own: libgomp spins "
            "GOMP_SPINCOUNT iterations, Intel and LLVM OpenMP KMP_BLOCKTIME 200 ms, 0 on hybrid CPUs "
            "and under OMP_WAIT_POLICY=PASSIVE). ONNX Runtime's "
            f"{ORT_SPINNING} (on by default) is a session option an app sets in code.")


def server_evidence(config, serving_cpus, target=None):
    """The manifest entries of this module: ``cpu_frequency`` (its ``start``), ``wait_knobs``, ``wait_knobs_note``."""
    kind = getattr(target, "kind", None) or getattr(config, "target", "lab")
    return {"cpu_frequency": {"cpus": sorted(int(c) for c in serving_cpus), "start": cpu_frequency(serving_cpus)},
            "wait_knobs": wait_knobs(config, target), "wait_knobs_note": wait_knobs_note(kind)}


def evidence_rows(manifest):
    """``[(label, text)]`` a report's header shows of a manifest's clocks and wait settings.

    A header of several cells (``"cells"`` in it) leaves out the wait
    policy and spin count, which differ per cell (the tables' columns say them).

    Examples
    --------
    >>> evidence_rows({"wait_knobs": {"OMP_WAIT_POLICY": "default", "KMP_BLOCKTIME": "default"}})
    [('runtime wait settings', 'OMP_WAIT_POLICY=default, KMP_BLOCKTIME=default')]
    """
    rows = []
    freq = manifest.get("cpu_frequency")
    if isinstance(freq, Mapping) and isinstance(freq.get("start"), Mapping):
        text = describe_frequency(dict(freq["start"]))
        if isinstance(freq.get("end"), Mapping):
            end = describe_frequency(dict(freq["end"]))
            text = text if end == text else f"{text}; at the end: {end}"
        rows.append(("CPU frequency", text))
    knobs = manifest.get("wait_knobs")
    if isinstance(knobs, Mapping):
        many = "cells" in manifest
        shown = [f"{k}={v}" for k, v in knobs.items() if not (many and k in _CELL_FACTORS)]
        rows.append(("runtime wait settings", ", ".join(shown)
                     + (" (the wait policy and spin count per cell: the tables' columns)" if many else "")))
    return rows
