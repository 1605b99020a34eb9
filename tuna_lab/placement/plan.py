"""A placement plan you can take away: per worker slot, where its main and pool threads go.

A :class:`Plan` is a :class:`~tuna_lab.placement.policies.Placement` reduced to
what applying it needs - the CPUs of every thread of every worker slot, the
OpenMP environment, and the machine it was made for (its CPU ids and
:func:`~tuna_lab.machine.fingerprint.fingerprint`). It is plain JSON, so it
can be made on one machine (or in a notebook, or by ``tuna-lab plan``) and
applied by the Gunicorn hooks (:mod:`tuna_lab.integrations.gunicorn`) or by
``tuna-lab pin --pid``. A plan made for another machine is refused with a
reason unless forced.

Formats (:meth:`Plan.render`):

* ``json``: the plan itself (:meth:`Plan.to_dict`);
* ``omp-places``: each slot's ``OMP_PLACES`` string - with
  ``OMP_PROC_BIND=close``, OpenMP thread ``t`` binds to place ``t``;
* ``env``: per slot, shell lines ``OMP_NUM_THREADS``, ``OMP_PLACES``,
  ``OMP_PROC_BIND``, ``GOMP_CPU_AFFINITY`` (GNU libgomp) and
  ``KMP_AFFINITY=explicit,proclist=[...]`` (Intel and LLVM OpenMP);
* ``onnxruntime``: per slot, ONNX Runtime's ``session.intra_op_thread_affinities``
  session-config value (:meth:`Plan.onnxruntime_affinities`);
* ``taskset``: ``taskset -p -c CPUS TID`` for every thread (the TIDs of a
  running server, or placeholders). A worker's main thread is bound as
  ``pin`` binds it (:func:`~tuna_lab.live.pools.main_rule`): to its own
  CPU only where its runtime does not size its pool from the main thread's
  CPUs, else to all of its slot's; a comment line says which, and why, and
  another one when fewer pool threads were found than the plan places (a
  pool that waits in libc, ONNX Runtime's, is found only by its activity,
  which ``tuna-lab pin --url`` measures);
* ``gunicorn``: a config snippet for a user's ``gunicorn.conf.py``.

Examples
--------
>>> from tuna_lab.machine import Topology
>>> from tuna_lab.placement import placement
>>> plan = placement("round-robin", 2, 2, Topology.synthetic("core:4 pu:1")).plan()
>>> plan.slots
(((0,), (1,)), ((2,), (3,)))
>>> plan.omp_places(1)
'{2},{3}'
>>> plan.onnxruntime_affinities(1)     # ORT numbers processors from 1: CPU 3 is "4"
'4'
>>> Plan.from_dict(plan.to_dict()) == plan
True
"""

import enum
import json
import re
import shlex
import textwrap
from collections import Counter
from dataclasses import dataclass, field

from .._checks import check_size, format_cpulist
from .._files import loads_json, read_bytes, write_json
from ..errors import PlanError
from .names import FORMATS

__all__ = ["Plan", "PinnedBy", "FORMATS", "PLAN_FORMAT", "parse_omp_places", "planned_cpus", "comment_text"]

#: The ``format`` field of a plan's JSON: its schema's name and version.
PLAN_FORMAT = "tuna_lab.plan/1"
#: The largest plan file read: a plan of thousands of CPUs is a few hundred kilobytes.
MAX_PLAN_BYTES = 16 << 20


class PinnedBy(enum.StrEnum):
    """Who enforces a placement: nobody, tuna_lab (by TID) or the OpenMP runtime (from the environment).

    A :class:`str`: it compares equal to, prints as and is written to JSON as its value.

    Examples
    --------
    >>> PinnedBy("openmp") is PinnedBy.OPENMP, PinnedBy.TUNA_LAB == "tuna_lab", f"{PinnedBy.NONE}"
    (True, True, 'none')
    """

    NONE = "none"
    TUNA_LAB = "tuna_lab"
    OPENMP = "openmp"

    @classmethod
    def of(cls, value, error):
        """``value`` as a member; ``error`` (an exception class) if it is none of them."""
        try:
            return cls(value)
        except ValueError:
            raise error(f"pinned_by must be one of {', '.join(m.value for m in cls)}, got {value!r}") from None


@dataclass(frozen=True)
class Plan:
    """Where every thread of every worker slot may run, and the machine that holds for.

    Parameters
    ----------
    policy : str
        The policy the plan comes from (``"tuna-scatter"``, ``"round-robin"`` ...).
    workers, threads : int
        ``W`` worker slots with ``T`` threads each: rank 0 is the worker's main
        thread, ranks ``1..T-1`` its OpenMP pool threads.
    slots : tuple
        ``slots[w][t]``: sorted tuple of the CPU ids thread ``t`` of slot ``w`` may use.
    cpus : tuple of int
        The CPU ids of the machine the plan was made for.
    fingerprint : str
        That machine's :func:`~tuna_lab.machine.fingerprint.fingerprint`.
    topology : str
        That machine's name (for people; the fingerprint decides).
    pinned_by : PinnedBy or {"tuna_lab", "openmp", "none"}
        Who binds: tuna_lab by TID, the OpenMP runtime from ``env``, or nobody (``cfs``);
        stored as a :class:`PinnedBy`.
    env : dict
        Environment the workers need (``OMP_*`` of the ``omp-*`` policies).
    relaxed : tuple of str
        For a ``tuna-*`` plan whose families admit no mapping: what the
        relaxed mapping exceeds (:attr:`Mapping.relaxed
        <tuna_lab.model.mapping.Mapping.relaxed>`, as text); empty otherwise.
    """

    policy: str
    workers: int
    threads: int
    slots: tuple
    cpus: tuple
    fingerprint: str
    topology: str = ""
    pinned_by: PinnedBy = PinnedBy.TUNA_LAB
    env: dict = field(default_factory=dict)
    relaxed: tuple = ()

    def __post_init__(self):
        W, T = check_size(self.workers, self.threads, PlanError)
        pinned_by = PinnedBy.of(self.pinned_by, PlanError)
        try:
            slots = tuple(tuple(tuple(sorted(int(c) for c in cpus)) for cpus in row) for row in self.slots)
            cpus = tuple(int(c) for c in self.cpus)
        except (TypeError, ValueError):
            raise PlanError("a plan's slots and cpus must hold CPU ids (integers)") from None
        if len(slots) != W or any(len(row) != T for row in slots):
            raise PlanError(f"a plan of {W} workers x {T} threads needs {W} slots of {T} CPU sets")
        known = set(cpus)
        bad = sorted({c for row in slots for s in row for c in s} - known)
        if any(not s for row in slots for s in row) or bad:
            raise PlanError("every thread of a plan needs a non-empty set of the plan's own CPUs"
                            + (f" (CPU {bad[0]} is not one of them)" if bad else ""))
        if not isinstance(self.fingerprint, str) or not self.fingerprint:
            raise PlanError("a plan needs the fingerprint of the machine it was made for")
        for name, value in (("workers", W), ("threads", T), ("slots", slots), ("cpus", cpus), ("pinned_by", pinned_by),
                            ("env", {str(k): str(v) for k, v in dict(self.env or {}).items()}),
                            ("relaxed", tuple(str(r) for r in self.relaxed or ()))):
            object.__setattr__(self, name, value)

    # -- building and reading ---------------------------------------------------------------
    @classmethod
    def from_placement(cls, placement):
        """The plan of a :class:`~tuna_lab.placement.policies.Placement`."""
        from ..machine.fingerprint import fingerprint

        topo = placement.topology
        mapping = placement.mapping
        relaxed = () if mapping is None else tuple(str(r) for r in mapping.relaxed)
        return cls(placement.policy, placement.workers, placement.threads, placement.allowed,
                   tuple(topo.cpus), fingerprint(topo), topo.name, placement.pinned_by, dict(placement.env), relaxed)

    def to_dict(self):
        """The plan as JSON-able data (the ``json`` format).

        Per slot: ``main`` (the main thread's CPUs) and ``pool`` (each pool
        thread's CPUs, by rank 1..T-1); plus the machine it was made for;
        ``relaxed`` only for a relaxed Tuna mapping.
        """
        extra = {"status": "relaxed", "relaxed": list(self.relaxed)} if self.relaxed else {}
        return {
            "format": PLAN_FORMAT,
            "policy": self.policy,
            "workers": self.workers,
            "threads": self.threads,
            "pinned_by": self.pinned_by.value,
            "env": dict(self.env),
            "topology": {"name": self.topology, "cpus": list(self.cpus), "fingerprint": self.fingerprint},
            "slots": [{"slot": w, "main": list(row[0]), "pool": [list(s) for s in row[1:]]}
                      for w, row in enumerate(self.slots)],
            **extra,
        }

    @classmethod
    def from_dict(cls, data):
        """A plan from :meth:`to_dict`'s data; :class:`~tuna_lab.errors.PlanError` if it is not one."""
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise PlanError(f"not a tuna_lab plan (expected \"format\": \"{PLAN_FORMAT}\")")
        try:
            topo = data["topology"]
            slots = sorted(data["slots"], key=lambda s: s["slot"])
            if [s["slot"] for s in slots] != list(range(len(slots))):
                raise PlanError("a plan's slots must be numbered 0..W-1")
            # Every CPU list is checked as such: "main": "10" must not be read as CPUs 1 and 0.
            rows = [[_cpu_list(s["main"], f"slot {s['slot']} main"),
                     *(_cpu_list(p, f"slot {s['slot']} pool") for p in _list(s["pool"], f"slot {s['slot']} pool"))]
                    for s in slots]
            return cls(data["policy"], data["workers"], data["threads"],
                       rows, _cpu_list(topo["cpus"], "topology cpus"), topo["fingerprint"],
                       topo.get("name", ""), data.get("pinned_by", "tuna_lab"), data.get("env") or {},
                       tuple(data.get("relaxed") or ()))
        except (KeyError, TypeError) as exc:
            raise PlanError(f"malformed plan: missing or wrong field {exc}") from None

    @classmethod
    def read(cls, path_or_text, follow=True):
        """A plan from a JSON file, or from JSON text (what ``TUNA_LAB_PLAN`` may hold).

        The file is read as :func:`tuna_lab._files.read_bytes` reads (a FIFO
        or a device refused, at most :data:`MAX_PLAN_BYTES`), and its JSON
        parsed with a bound on its nesting: any of these is one
        :class:`~tuna_lab.errors.PlanError` line. ``follow=False`` refuses a
        link at the path itself (a plan in a shared folder).

        Examples
        --------
        >>> Plan.read("/dev/zero")
        Traceback (most recent call last):
        ...
        tuna_lab.errors.PlanError: /dev/zero is not a regular file (a character device); refusing to read it
        """
        text = str(path_or_text)
        if text.lstrip().startswith("{"):
            return cls.from_dict(loads_json(text, where="the plan's JSON", error=PlanError))
        try:
            data = read_bytes(text, limit=MAX_PLAN_BYTES, follow=follow, error=PlanError)
        except FileNotFoundError as exc:
            raise PlanError(f"cannot read plan {text}: {exc.strerror or exc}") from None
        return cls.from_dict(loads_json(data, where=f"plan {text}", error=PlanError))

    def write(self, path, mode=0o644):
        """Write the plan as JSON to ``path``: whole or not at all, never through a link (:func:`write_json`)."""
        write_json(path, self.to_dict(), mode=mode, error=PlanError)

    # -- the machine it is for --------------------------------------------------------------
    def check_machine(self, topology, force=False):
        """Refuse (:class:`~tuna_lab.errors.PlanError`) a plan made for another machine than ``topology``.

        With ``force``, a plan whose CPUs all exist on ``topology`` is accepted
        whatever its fingerprint; one naming CPUs the machine lacks never is.
        Returns the plan.
        """
        from ..machine.fingerprint import fingerprint

        here = fingerprint(topology)
        if here != self.fingerprint and not force:
            raise PlanError(f"the plan was made for another machine ({self.topology or 'unnamed'}, "
                            f"fingerprint {self.fingerprint}; this one is {here}): make a plan here, "
                            "or use --force to apply it anyway")
        used = sorted({c for row in self.slots for s in row for c in s} - set(topology.cpus))
        if used:
            raise PlanError(f"the plan uses CPUs {format_cpulist(used)} that this machine does not let us use")
        return self

    # -- formats ------------------------------------------------------------------------------
    def omp_places(self, slot):
        """Slot ``slot``'s ``OMP_PLACES``: one place per thread, in rank order.

        With ``OMP_PROC_BIND=close`` and ``OMP_NUM_THREADS=T``, libgomp binds
        OpenMP thread ``t`` (the main thread is thread 0) to place ``t``.
        """
        return ",".join("{" + ",".join(map(str, cpus)) + "}" for cpus in self.slots[slot])

    def onnxruntime_affinities(self, slot):
        """Slot ``slot``'s ``session.intra_op_thread_affinities`` for ONNX Runtime.

        One ``;``-separated group per intra-op thread *other than the caller*
        (ranks 1..T-1: the thread that calls ``run`` is the worker's main
        thread, which ORT does not bind), each a ``,`` list of ``a-b`` ranges
        of logical processor ids counted **from 1**, ORT's convention (CPU 0
        is ``1``; checked on Linux with ORT 1.32: ``"2"`` binds to CPU 1).
        ORT wants exactly ``intra_op_num_threads - 1`` groups, so the session
        needs ``intra_op_num_threads = T``. Empty for ``T = 1``.

        Examples
        --------
        >>> from tuna_lab.machine import Topology
        >>> from tuna_lab.placement import placement
        >>> plan = placement("round-robin", 1, 3, Topology.synthetic("core:4 pu:1")).plan()
        >>> plan.slots[0], plan.onnxruntime_affinities(0)
        (((0,), (1,), (2,)), '2;3')
        """
        return ";".join(format_cpulist([c + 1 for c in cpus]).replace(" ", "") for cpus in self.slots[slot][1:])

    def omp_env(self, slot):
        """Slot ``slot``'s OpenMP environment as ``[(name, value)]``, for GNU, Intel and LLVM OpenMP.

        ``OMP_PLACES`` with ``OMP_PROC_BIND=close`` binds thread ``t`` to place
        ``t`` in every OpenMP runtime; ``KMP_AFFINITY`` says the same to Intel
        and LLVM OpenMP (which honour it over ``OMP_PLACES``); GNU libgomp's
        ``GOMP_CPU_AFFINITY`` binds each thread to one CPU, so it is given
        only when every thread of the slot has exactly one.

        Examples
        --------
        >>> from tuna_lab.machine import Topology
        >>> from tuna_lab.placement import placement
        >>> plan = placement("round-robin", 2, 2, Topology.synthetic("core:4 pu:1")).plan()
        >>> plan.omp_env(1)  # doctest: +NORMALIZE_WHITESPACE
        [('OMP_NUM_THREADS', '2'), ('OMP_PLACES', '{2},{3}'), ('OMP_PROC_BIND', 'close'),
         ('GOMP_CPU_AFFINITY', '2 3'), ('KMP_AFFINITY', 'explicit,proclist=[2,3]')]
        """
        row = self.slots[slot]
        env = [("OMP_NUM_THREADS", str(self.threads)), ("OMP_PLACES", self.omp_places(slot)),
               ("OMP_PROC_BIND", "close")]
        if all(len(cpus) == 1 for cpus in row):
            env.append(("GOMP_CPU_AFFINITY", " ".join(str(cpus[0]) for cpus in row)))
        procs = ",".join(str(cpus[0]) if len(cpus) == 1 else "{" + ",".join(map(str, cpus)) + "}" for cpus in row)
        env.append(("KMP_AFFINITY", f"explicit,proclist=[{procs}]"))
        return env

    def render(self, kind="json", tids=None, worker_class=None):
        """The plan in one of :data:`FORMATS`.

        Every name the plan holds (its policy, its machine's name, which may
        be a file's) is written into a comment as one safe line
        (:func:`comment_text`), into Python as a ``repr`` and into a shell
        line quoted: what the user did not write is never code.

        Parameters
        ----------
        kind : str
            ``json``, ``omp-places``, ``env``, ``onnxruntime``, ``taskset`` or ``gunicorn``.
        tids : list of dict, optional
            For ``taskset``: the threads of a running server, each with
            ``slot``, ``rank`` and ``tid`` (from
            :func:`tuna_lab.live.pin.server_threads`), and for a main
            thread (rank 0) ``exact_main`` (may it be bound to its own CPU
            alone: :func:`~tuna_lab.live.pools.main_rule`; missing: no),
            ``pid`` and ``main_note`` (why, for the comment line); without
            them the lines hold placeholders, and every main thread gets all of
            its slot's CPUs.
        worker_class : str, optional
            For ``gunicorn``: the ``worker_class`` line to write (``sync``,
            ``gthread``, a dotted ``module.Class``); by default none, and the
            user's own config keeps its worker class.

        Examples
        --------
        >>> from tuna_lab.machine import Topology
        >>> from tuna_lab.placement import placement
        >>> plan = placement("round-robin", 1, 1, Topology.synthetic("core:1 pu:1")).plan()
        >>> plan.render("omp-places").splitlines()[0]
        '# round-robin: 1 workers x 1 threads on synthetic:core:1 pu:1 (fingerprint ...); OpenMP thread t ...'
        """
        if kind not in FORMATS:
            raise PlanError(f"unknown plan format {kind!r}; choose from {', '.join(FORMATS)}")
        if worker_class is not None and kind != "gunicorn":
            raise PlanError(f"a worker class is a Gunicorn setting: --format {kind} has none")
        if worker_class is not None and not _WORKER_CLASS.fullmatch(str(worker_class)):
            raise PlanError(f"a Gunicorn worker class is a name such as sync, gthread or module.Class, "
                            f"got {worker_class!r}")
        if kind == "json":
            # One line per field and per slot: readable, and diffable between two plans.
            data = self.to_dict()
            slots = ",\n".join(f"  {json.dumps(s)}" for s in data.pop("slots"))
            head = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items())
            return f"{{\n{head},\n \"slots\": [\n{slots}\n ]\n}}"
        head = comment_text(f"{self.policy}: {self.workers} workers x {self.threads} threads on "
                            f"{self.topology or 'a machine'} (fingerprint {self.fingerprint})")
        notes = [f"# {line}" for note in self.export_notes(kind, worker_class)
                 for line in textwrap.wrap(note, 110, break_long_words=False, break_on_hyphens=False)]
        if kind == "omp-places":
            return "\n".join([f"# {head}; OpenMP thread t binds to place t", *notes,
                              *(f'slot {w}: OMP_PLACES="{self.omp_places(w)}" OMP_PROC_BIND=close '
                                f"OMP_NUM_THREADS={self.threads}" for w in range(self.workers))])
        if kind == "env":
            lines = [f"# {head}", "# Give each worker its own slot's lines before it loads its OpenMP runtime.", *notes]
            for w in range(self.workers):
                lines.append(f"# slot {w}")
                lines += [f"{name}={shlex.quote(value)}" for name, value in self.omp_env(w)]
                if not any(name == "GOMP_CPU_AFFINITY" for name, _ in self.omp_env(w)):
                    lines.append("# no GOMP_CPU_AFFINITY: it binds each thread to one CPU, this slot's threads "
                                 "have several (OMP_PLACES says it)")
            return "\n".join(lines)
        if kind == "onnxruntime":
            lines = [f"# {head}",
                     "# Per slot: SessionOptions.intra_op_num_threads = T and",
                     "# add_session_config_entry(\"session.intra_op_thread_affinities\", VALUE): one group per",
                     "# intra-op thread but the caller (the worker's main thread, bind it yourself), logical",
                     "# processors numbered from 1 as ORT counts them (CPU 0 is 1).", *notes]
            if self.threads == 1:
                lines.append("# T=1: no intra-op thread besides the caller, nothing to set")
            lines += [f"slot {w}: intra_op_num_threads={self.threads} "
                      f"session.intra_op_thread_affinities={self.onnxruntime_affinities(w)}"
                      for w in range(self.workers) if self.threads > 1]
            return "\n".join(lines)
        if kind == "taskset":
            return self._taskset(head, tids)
        # ensure_ascii (json's default): the literal below is plain ASCII, whatever a name holds.
        plan_json = json.dumps(self.to_dict(), separators=(",", ":"))
        return "\n".join([
            # Nothing but our own words on the first two lines: Python reads a coding declaration there
            # ("# coding: utf-7" in a machine's name would change how the rest of the file is read).
            "# tuna_lab plan: paste into your gunicorn.conf.py. Each worker takes a slot, wakes its OpenMP pool",
            "# once and binds its main and pool threads by TID; a replacement worker gets the same slot.",
            f"# {head}",
            *notes,
            "import os",
            "",
            # repr: a quote or backslash in a name must not end or change the literal
            f"os.environ[\"TUNA_LAB_PLAN\"] = {plan_json!r}",
            "from tuna_lab.integrations.gunicorn import post_fork, post_worker_init, child_exit, on_exit  # noqa: E402,F401",
            "",
            f"workers = {self.workers}",
            *([] if worker_class is None else [f"worker_class = {str(worker_class)!r}"]),
        ])

    def export_notes(self, kind, worker_class=None):
        """What format ``kind`` cannot do for every server, and what to do instead: lines of text.

        :meth:`render` writes them as comments; ``tuna-lab plan`` also says them
        on stderr, where a user who pipes the output sees them.

        * ``env``, ``omp-places``, ``onnxruntime``: each worker needs its own
          slot's value, which uvicorn's workers and BentoML's cannot be given.
        * ``gunicorn``: the snippet keeps the user's worker class unless
          ``worker_class`` names one; under ``gthread``, what the plan places.

        Examples
        --------
        >>> from tuna_lab.machine import Topology
        >>> from tuna_lab.placement import placement
        >>> plan = placement("round-robin", 1, 1, Topology.synthetic("core:1 pu:1")).plan()
        >>> plan.export_notes("json"), len(plan.export_notes("gunicorn", "sync"))
        ((), 0)
        """
        if kind in ("env", "omp-places", "onnxruntime"):
            value = "session options" if kind == "onnxruntime" else "variables"
            return (f"Each worker needs its own slot's {value}, set before it loads its runtime: Gunicorn can "
                    "give them in a post_fork hook, but uvicorn --workers and BentoML start every worker alike "
                    "and cannot give each its own. For those, use the Gunicorn hooks "
                    "(tuna_lab.integrations.gunicorn), or bind the running server with "
                    "`tuna-lab pin --pid MASTER`.",)
        if kind != "gunicorn":
            return ()
        notes = []
        if worker_class is None:
            notes.append("worker_class: this snippet sets none, so your config's own stays "
                         "(`tuna-lab plan --worker-class NAME` writes one).")
        if worker_class in (None, "gthread"):
            notes.append("Under gthread, the plan places a worker's main thread and the runtime pool of the thread "
                         f"that calls the model; with --threads K > 1 each calling thread has its own libgomp team "
                         f"(up to K per worker), so the placement is per slot: a worker's teams share its slot's "
                         f"CPUs, {self.workers} x K x {self.threads} threads in all. --threads 1, or fewer runtime "
                         "threads (nthread, OMP_NUM_THREADS), gives each team CPUs of its own.")
        return tuple(notes)

    def _taskset(self, head, tids):
        """The ``taskset`` format: a main thread bound as ``pin`` binds it, and a comment line that says how.

        A TID is written quoted for the shell (a placeholder or a caller's text is one word, never
        code); every comment is one line (:func:`comment_text`).
        """
        lines = [f"# {head}"]
        if tids is None:
            lines += ["# TIDs unknown: give --pid MASTER to fill in a running server's threads",
                      "# Main threads (rank 0) get all of their slot's CPUs: XGBoost on libgomp without OMP_PLACES",
                      "# sizes its pool from its main thread's current CPUs at every call, and one CPU would leave it",
                      "# one thread. --pid MASTER binds each main thread as `tuna-lab pin` does: to its own CPU",
                      "# where its runtime allows."]
            tids = [{"slot": w, "rank": t, "tid": f"<TID of slot {w} rank {t}>"}
                    for w in range(self.workers) for t in range(self.threads)]
        # Pool threads found per slot: a pool that waits in libc (ONNX Runtime's) is found only by its
        # activity, which these lines do not measure; a comment says it is left unbound.
        found = Counter(th.get("slot") for th in tids if th.get("rank"))
        said = set()
        for th in tids:
            slot, rank = th.get("slot"), th.get("rank")
            if slot is not None and not 0 <= slot < self.workers:
                raise PlanError(f"thread {th['tid']!r} is of slot {slot}, but the plan has {self.workers} slots")
            if th.get("level") == "slot" and th.get("planned") is not None:
                # A threaded worker placed by slot: every thread that works on the slot's CPUs, as `pin` does.
                if slot not in said:
                    said.add(slot)
                    lines.append(comment_text(f"# worker {th.get('pid')} (slot {slot}): several calling threads, "
                                              f"each with its own team: its threads share the slot's CPUs"))
                lines.append(f"taskset -p -c {format_cpulist(th['planned'])} {shlex.quote(str(th['tid']))}")
                continue
            if rank is None or rank >= self.threads or slot is None:
                continue
            exact = bool(th.get("exact_main")) if rank == 0 else True
            cpus = planned_cpus(self, slot, rank, exact_main=exact)
            if rank == 0 and "pid" in th and self.threads > 1:
                how = (f"CPU {format_cpulist(cpus)} alone" if exact else
                       f"all of slot {slot}'s CPUs {format_cpulist(cpus)}, not only CPU "
                       f"{format_cpulist(self.slots[slot][0])}")
                why = th.get("main_note") or ""
                why = why.split(": ", 1)[1] if ": " in why else why
                worker = comment_text(th["pid"])
                lines.append(comment_text(f"# worker {worker} (slot {slot}): main thread on {how}"
                                          + (f": {why}" if why else "")))
                if found[slot] < self.threads - 1:
                    lines.append(f"# worker {worker} (slot {slot}): {found[slot]} of "
                                 f"{self.threads - 1} pool threads found, the others are left as they are: a pool "
                                 "that waits in libc (ONNX Runtime's) is told by its activity: give "
                                 "--url URL (and --body) to send the few requests that show it")
            lines.append(f"taskset -p -c {format_cpulist(cpus)} {shlex.quote(str(th['tid']))}")
        return "\n".join(lines)


def comment_text(text):
    """``text`` as one line that is safe in a ``#`` comment of Python or of a shell, and on a terminal.

    Printable text stays as it is. Anything else - a newline or carriage
    return that would end the comment and start a line of code, another
    control or format character (an escape sequence, a right-to-left mark),
    a lone surrogate from a file name that is not UTF-8 - is written as a
    Python ``repr`` writes it: ``\\n``, ``\\x1b``, ``\\udcff``.

    Examples
    --------
    >>> comment_text('x.xml\\nimport os; os.system("id")')
    'x.xml\\\\nimport os; os.system("id")'
    >>> comment_text("café 2s")
    'café 2s'
    """
    text = str(text)
    return text if text.isprintable() else repr(text)[1:-1]


# A Gunicorn worker class as its config names one: sync, gthread, or module.Class (never code, quotes or spaces).
_WORKER_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def parse_omp_places(text):
    """The CPU sets of an explicit ``OMP_PLACES`` list (``{0,1},{2}`` or ``{0:2},{2}``).

    Examples
    --------
    >>> parse_omp_places("{0,16},{8:2}")
    [(0, 16), (8, 9)]
    """
    found = re.findall(r"\{([^{}]*)\}", text)
    places = []
    try:
        if ",".join("{" + p + "}" for p in found) != text.strip():
            raise ValueError
        for place in found:
            cpus = []
            for item in place.split(","):
                start, _, length = item.strip().partition(":")
                first, count = int(start), int(length) if length else 1
                if first < 0 or count < 1:
                    raise ValueError            # an empty place, or a negative CPU id
                cpus.extend(range(first, first + count))
            places.append(tuple(cpus))
    except ValueError:                          # int("a"), int("") of "{}" too
        raise PlanError(f"not an explicit OMP_PLACES list: {text!r}") from None
    return places


def _list(value, what):
    if not isinstance(value, list):
        raise PlanError(f"malformed plan: {what} must be a list, got {value!r}")
    return value


def _cpu_list(value, what):
    """A JSON list of CPU ids (non-negative integers, not strings or booleans), as a list."""
    ok = isinstance(value, list) and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in value)
    if not ok:
        raise PlanError(f"malformed plan: {what} must be a list of CPU ids, got {value!r}")
    return value


def planned_cpus(plan, slot, rank, exact_main=True):
    """The CPUs ``plan`` gives thread ``rank`` of worker ``slot``: rank 0 is the main thread, 1.. its pool.

    The main thread gets its own CPUs only with ``exact_main``; otherwise all
    of the slot's: an OpenMP runtime that counts the main thread's current
    CPUs (XGBoost's libgomp without ``OMP_PLACES``) would shrink its pool to
    one thread. A pool thread beyond the plan's ``T - 1`` (should a pool be
    larger) also gets all of the slot's CPUs.

    Examples
    --------
    >>> from tuna_lab.machine import Topology
    >>> from tuna_lab.placement import placement
    >>> plan = placement("round-robin", 2, 2, Topology.synthetic("core:4 pu:1")).plan()
    >>> planned_cpus(plan, 1, 0), planned_cpus(plan, 1, 0, exact_main=False), planned_cpus(plan, 1, 5)
    ((2,), (2, 3), (2, 3))
    """
    row = plan.slots[slot]
    if (rank == 0 and exact_main) or 0 < rank < plan.threads:
        return tuple(row[rank])
    return tuple(sorted({c for cpus in row for c in cpus}))
