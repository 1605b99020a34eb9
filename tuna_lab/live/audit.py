"""Audit a running server's placement: what the kernel shows now, beside the plan, and what is wrong with it.

:func:`snapshot` reads the machine over an interval - every thread of the
server (master, helpers, front ends, workers; the workers' threads by the
pool classification ``pin`` uses) with its mask, the CPU it last ran on, and
its CPU, run-queue wait and migrations per second; the plan (``--plan``, the
Gunicorn hooks' plan, or the masks ``pin --pid`` recorded); busy threads of
other processes; interrupts per serving CPU; the cgroup's throttling. It
changes nothing. :func:`findings` is pure: from a snapshot it names each
fault with its evidence and one line on what to do:

``drift``
    a thread of a worker not on the CPUs the plan (or the pin) gave it;
``replaced``
    a worker started after the pin (its predecessor is gone), not pinned;
``overlap``
    the pools of two workers share CPUs the plan keeps apart;
``smt-split``
    a physical core's SMT siblings hold threads of workers the plan does not put there;
``outside-plan``
    a busy thread of the server that no plan places (the master, a helper, a front end, an extra thread);
``foreign``
    another process's busy thread confined to the serving CPUs;
``irq``
    a device's interrupts on the serving CPUs that could be sent elsewhere;
``throttled``
    the server's cgroup ran out of its CPU quota during the interval;
``offline`` / ``isolated``
    a CPU of the plan that is offline, or isolated from the scheduler (``isolcpus``).

Each finding is a ``fault`` (``audit`` exits 1) or a ``note`` (evidence the
operator cannot act on here, e.g. other load when the server has every CPU).
Without a server (``master=None``) the snapshot is machine-wide: which
processes are pinned where, and which pins overlap.

:func:`isolation_moves` turns the ``foreign`` and ``irq`` faults into the
moves that take them off the serving CPUs (Red Hat tuna's ``isolate``, tied
to the plan); :func:`apply_isolation` makes them and records each (the mask
before and the mask set) in this user's private state, and
:func:`undo_isolation` puts back exactly what it changed - a mask someone
changed since is theirs and left alone.
"""

import os
import time
from dataclasses import asdict, dataclass, field

import psutil

from .._checks import format_cpulist, parse_cpulist
from ..errors import BindingError, PinError
from ..machine import irqs as irq_reader
from ..machine import sched
from ..machine import procfs
from ..machine.linuxfs import system_cpus
from ..machine.procfs import start_ticks
from .binding import bind
from .state import state_dir, state_lock

__all__ = ["Finding", "Snapshot", "snapshot", "findings", "Move", "isolation_moves", "apply_isolation",
           "undo_isolation", "isolation_warnings", "BUSY_SHARE", "IRQ_RATE", "isolation_record_path", "MIN_INTERVAL",
           "SOUND_INTERVAL"]

#: The shortest interval whose rates mean anything (s): CPU time is counted in clock ticks of 10 ms.
MIN_INTERVAL = 0.1
#: The shortest interval whose findings ``--isolate`` acts on (s): a tick more or less moves a rate by 2%.
SOUND_INTERVAL = 0.5
#: A thread counts as busy when it runs at least this share of one CPU over the interval.
BUSY_SHARE = 0.2
#: A device's interrupts on the serving CPUs matter from this many per second.
IRQ_RATE = 5.0


@dataclass
class Finding:
    """One fault (or note): ``kind`` (see the module), ``what`` in words, ``evidence`` (JSON-able), ``advice``."""

    kind: str
    what: str
    evidence: dict
    advice: str
    severity: str = "fault"

    def to_dict(self):
        return asdict(self)


@dataclass
class Snapshot:
    """What :func:`snapshot` read: JSON-able plain data, so that :func:`findings` is a pure function of it.

    ``threads``: one dict per thread of the server (``pid``, ``process`` role,
    ``slot``, ``tid``, ``comm``, ``role``, ``rank``, ``cpus``, ``planned``,
    ``last_cpu``, ``cpu_rate`` (CPUs' worth), ``run_delay_rate`` (s of wait
    per s), ``migration_rate`` (per s, None where not exposed)); ``foreign``
    the same for busy threads of other processes (with ``movable``);
    ``irqs`` per numbered or per-CPU interrupt line its rate on the serving
    CPUs and its affinity; ``pinned`` (machine-wide view) per process its
    narrowed masks.
    """

    master: int = None
    interval: float = 0.0
    online: list = field(default_factory=list)
    isolated: list = field(default_factory=list)
    cores: list = field(default_factory=list)
    plan: dict = None
    plan_source: str = None
    serving: list = field(default_factory=list)
    processes: list = field(default_factory=list)
    threads: list = field(default_factory=list)
    recorded_workers: dict = field(default_factory=dict)
    foreign: list = field(default_factory=list)
    irqs: list = field(default_factory=list)
    throttling: dict = None
    pinned: list = field(default_factory=list)
    #: Threaded workers (:func:`tuna_lab.live.threads.threading_summary`), read under the interval's traffic.
    threading: dict = None
    migrations_note: str = None

    def to_dict(self):
        return asdict(self)


# -- reading the machine -------------------------------------------------------------------------

def _cpu_times():
    """``{(pid, tid): cpu seconds}`` of every user thread on the machine (kernel threads left out)."""
    out = {}
    for pid in procfs.pids():
        if _kernel_thread(pid):
            continue
        try:
            times = procfs.thread_cpu(pid)
        except OSError:
            continue
        out.update(((pid, tid), seconds) for tid, seconds in times.items())
    return out


def _kernel_thread(pid):
    """Whether ``pid`` is a kernel thread (kthreadd's child, or kthreadd): it has no user memory to move."""
    try:
        proc = psutil.Process(pid)
        return pid == 2 or proc.ppid() == 2
    except psutil.Error:
        return True


def _sched_rows(pids):
    """``{tid: ThreadSched}`` of every thread of ``pids``."""
    out = {}
    for pid in pids:
        out.update({tid: (pid, t) for tid, t in sched.process_sched(pid).items()})
    return out


def _rates(before, after, seconds):
    """CPU, run-queue wait and migration rates of one thread between two :class:`ThreadSched` readings."""
    if before is None or after is None:
        return None, None, None
    migr = None
    if before.migrations is not None and after.migrations is not None:
        migr = (after.migrations - before.migrations) / seconds
    return ((after.cpu_seconds - before.cpu_seconds) / seconds,
            (after.run_delay_seconds - before.run_delay_seconds) / seconds, migr)


def _hooks_plan(master):
    """The plan the Gunicorn hooks of ``master`` placed its workers by; None for a server without them."""
    from .state import hook_records
    from ..placement.plan import Plan

    records = hook_records(master)
    if records is None:
        return None
    try:
        return Plan.read(os.path.join(os.path.dirname(records), "plan.json"), follow=False)
    except (OSError, ValueError):
        return None


def _machine():
    """Online CPUs, isolated CPUs and SMT sibling groups of this machine."""
    from ..machine import Topology

    online = sorted(system_cpus("online") or os.sched_getaffinity(0))
    isolated = sorted(system_cpus("isolated") or ())
    try:
        cores = [list(c) for c in Topology.from_sysfs().siblings()]
    except (OSError, ValueError):
        cores = [[c] for c in online]
    return online, isolated, cores


def snapshot(master=None, plan=None, interval=1.0, choice=None, roles=None):
    """Read the running server ``master`` (or, with None, the whole machine) over ``interval`` seconds.

    Parameters
    ----------
    master : int, optional
        The server's master PID; None: the machine-wide view.
    plan : Plan, optional
        What the server should look like; else the Gunicorn hooks' plan, or
        the masks ``pin --pid`` recorded, or none.
    interval : float
        Seconds between the two readings the rates come from.
    choice : WorkerChoice, optional
        The workers, when the user names them.
    roles : ServerRoles, optional
        The server's processes, found already (then ``choice`` is not used).

    Raises
    ------
    PinError
        No such process, or no workers found (see :func:`~tuna_lab.live.roles.server_roles`).
    """
    from .ledger import pin_records
    from .roles import server_roles
    from .pin import server_threads

    online, isolated, cores = _machine()
    snap = Snapshot(master=None if master is None else int(master), interval=float(interval), online=online,
                    isolated=isolated, cores=cores, migrations_note=sched.MIGRATIONS_NOTE)
    if master is None:
        start = time.monotonic()
        before = _cpu_times()
        time.sleep(interval)
        snap.interval = time.monotonic() - start      # rates over the time measured, not the time asked for
        snap.pinned = _pinned_processes(online, before, _cpu_times(), snap.interval)
        return snap
    roles = roles or server_roles(master, choice)
    if plan is not None:
        snap.plan_source = "--plan"
    else:
        plan = _hooks_plan(master)
        snap.plan_source = "the Gunicorn hooks' plan" if plan is not None else None
    # What pin --pid recorded: drift from the masks it set, and workers replaced since (front processes are none).
    records = pin_records(master)
    recorded_threads = records["threads"]
    recorded_workers = {p: {"started": w["started"], "slot": w["slot"]} for p, w in records["workers"].items()
                        if w["slot"] is not None}
    if plan is None and recorded_threads:
        snap.plan_source = "the masks `pin --pid` set"
    snap.recorded_workers = {str(p): w for p, w in recorded_workers.items()}
    snap.plan = None if plan is None else plan.to_dict()
    members = [roles.master, *roles.helpers, *roles.workers]
    pids = [p.pid for p in members]
    start = time.monotonic()
    everyone = _cpu_times()
    first = _sched_rows(pids)
    irq_before = {irq.name: irq for irq in irq_reader.irq_table()}
    throttle_before = sched.cgroup_throttling(master)
    time.sleep(interval)
    # Rates are over the time really measured (from one reading's start to the next's), never the time asked
    # for: a sleep of 1e-300 s still lasts the readings' own time, and divides nothing by 1e-300.
    interval = snap.interval = time.monotonic() - start
    second = _sched_rows(pids)
    irq_after = irq_reader.irq_table()
    throttle_after = sched.cgroup_throttling(master)
    everyone_after = _cpu_times()
    from .threads import activity_between, threading_summary

    # Traffic during the interval tells the threads by what they do, as `pin --url` does (one classifier); a
    # glance (status's drift check) is too short to tell anything by.
    activity = activity_between(first, second, set(roles.worker_pids)) if interval >= 0.5 else None
    workers = server_threads(master, plan, activity, roles=roles)
    snap.threading = threading_summary(master, workers, plan)
    by_tid = {t["tid"]: (w, t) for w in workers for t in w["threads"]}
    role_of = {p.pid: p.role for p in members}
    for tid, (pid, now) in sorted(second.items(), key=lambda kv: (kv[1][0], kv[0])):
        cpu, delay, migr = _rates(first.get(tid, (None, None))[1], now, interval)
        w, t = by_tid.get(tid, (None, None))
        planned = None if t is None else t["planned"]
        if planned is None and tid in recorded_threads and recorded_threads[tid]["pid"] == pid:
            planned = recorded_threads[tid]["set"]
        snap.threads.append({
            "pid": pid, "process": role_of[pid], "slot": None if w is None else w["slot"], "tid": tid,
            "comm": now.comm, "role": role_of[pid] if t is None else t["role"],
            "rank": None if t is None else t["rank"], "cpus": sorted(now.affinity), "planned": planned,
            "recorded": tid in recorded_threads, "last_cpu": now.last_cpu, "cpu_rate": cpu,
            "run_delay_rate": delay, "migration_rate": migr})
    snap.serving = sorted(plan.cpus) if plan is not None and plan.cpus else sorted(
        {c for t in snap.threads if t["process"] == "worker" for c in (t["planned"] or t["cpus"])})
    snap.foreign = _foreign(set(pids), set(snap.serving), everyone, everyone_after, interval, online)
    snap.irqs = _irq_rates(irq_before, irq_after, snap.serving, interval)
    if throttle_before is not None and throttle_after is not None:
        snap.throttling = {"nr_throttled": throttle_after["nr_throttled"] - throttle_before["nr_throttled"],
                           "throttled_seconds": throttle_after["throttled_seconds"]
                           - throttle_before["throttled_seconds"],
                           "quota_cpus": throttle_after["quota_cpus"], "version": throttle_after["version"]}
    snap.processes = [p.to_dict() for p in members]
    return snap


def _foreign(server_pids, serving, before, after, seconds, online):
    """Busy threads of other processes that may run on the serving CPUs, with their mask and last CPU."""
    out = []
    me = os.getpid()
    for (pid, tid), cpu in after.items():
        rate = (cpu - before.get((pid, tid), cpu)) / seconds
        if pid in server_pids or pid == me or rate < BUSY_SHARE:
            continue
        row = sched.thread_sched(pid, tid)
        if row is None or not (row.affinity & serving):
            continue
        rest = sorted(set(online) - serving)
        out.append({"pid": pid, "tid": tid, "comm": row.comm, "cpus": sorted(row.affinity),
                    "last_cpu": row.last_cpu, "cpu_rate": rate, "confined": row.affinity <= serving,
                    "movable": bool(rest)})
    return sorted(out, key=lambda r: -r["cpu_rate"])


def _irq_rates(before, after, serving, seconds):
    """Per interrupt line that fired on a serving CPU: its rate there and its affinity."""
    out = []
    for irq in after:
        old = before.get(irq.name)
        if old is None:
            continue
        on = {c: (irq.counts[c] - old.counts[c]) / seconds for c in serving if c < len(irq.counts)}
        if not any(on.values()):
            continue
        affinity = irq_reader.irq_affinity(irq.name)
        out.append({"name": irq.name, "label": irq.label, "rate": sum(on.values()),
                    "per_cpu": {str(c): r for c, r in on.items() if r}, "affinity": None if affinity is None
                    else sorted(affinity)})
    return sorted(out, key=lambda r: -r["rate"])


def _pinned_processes(online, before, after, seconds):
    """Per user process whose threads are not all on every online CPU: its narrowed masks and CPU rate."""
    everywhere = frozenset(online)
    by_pid = {}
    for (pid, tid), cpu in after.items():
        try:
            cpus = frozenset(os.sched_getaffinity(tid))
        except OSError:
            continue
        if cpus >= everywhere:
            continue
        entry = by_pid.setdefault(pid, {"pid": pid, "masks": {}, "cpu_rate": 0.0})
        entry["masks"].setdefault(format_cpulist(cpus), []).append(tid)
        entry["cpu_rate"] += (cpu - before.get((pid, tid), cpu)) / seconds
    out = []
    for pid, entry in sorted(by_pid.items()):
        try:
            entry["command"] = " ".join(psutil.Process(pid).cmdline())[:200]
        except psutil.Error:
            continue
        entry["cpus"] = sorted({c for text in entry["masks"] for c in parse_cpulist(text)})
        out.append(entry)
    return out


# -- findings (pure) -------------------------------------------------------------------------------

def findings(snap, plan=None):
    """The faults and notes of a :class:`Snapshot` (or its dict), each with evidence and what to do; pure.

    ``plan`` (a Plan or its dict) overrides the snapshot's own.
    """
    snap = snap if isinstance(snap, Snapshot) else Snapshot(**snap)
    plan = snap.plan if plan is None else (plan if isinstance(plan, dict) else plan.to_dict())
    out = []
    if snap.master is None:
        return _machine_findings(snap)
    master = snap.master
    repin = f"tuna-lab pin --pid {master} " + ("--plan FILE" if snap.plan_source == "--plan" else "...")
    workers = sorted({t["pid"] for t in snap.threads if t["process"] == "worker"})
    # drift: a placed thread away from its CPUs.
    for t in snap.threads:
        if t["planned"] is not None and sorted(t["planned"]) != sorted(t["cpus"]):
            out.append(Finding(
                "drift", f"worker {t['pid']} {t['role']} thread {t['tid']} is on CPUs {format_cpulist(t['cpus'])}, "
                         f"not the {format_cpulist(t['planned'])} {snap.plan_source or 'the plan'} gives it",
                {"pid": t["pid"], "tid": t["tid"], "role": t["role"], "cpus": t["cpus"], "planned": t["planned"]},
                f"someone changed its mask since: pin it again ({repin}), or `pin --watch --enforce` to keep it"))
    # replaced: a worker pin --pid never saw, while the workers it pinned are gone.
    if snap.recorded_workers:
        recorded = {int(p) for p in snap.recorded_workers}
        gone = sorted(recorded - set(workers))
        for pid in workers:
            if pid in recorded or any(t["recorded"] for t in snap.threads if t["pid"] == pid):
                continue
            out.append(Finding(
                "replaced", f"worker {pid} started after the pin" + (
                    f" (worker{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} it replaced "
                    f"{'are' if len(gone) > 1 else 'is'} gone)" if gone else "") + ": none of its threads is pinned",
                {"pid": pid, "gone": gone, "cpus": sorted({c for t in snap.threads if t["pid"] == pid
                                                           for c in t["cpus"]})},
                f"pin it again ({repin}); `pin --watch` re-pins replaced workers as they start"))
    out += _overlaps(snap, plan, workers)
    out += _smt_split(snap, plan, workers)
    # outside the plan: busy threads of the server no plan places.
    for t in snap.threads:
        if (t["planned"] is None and (t["cpu_rate"] or 0) >= BUSY_SHARE
                and (t["process"] != "worker" or t["role"] == "other")):
            where = "its master" if t["process"] == "master" else f"a {t['process']}" if t["process"] != "worker" \
                else f"worker {t['pid']}"
            out.append(Finding(
                "outside-plan", f"thread {t['tid']} ({t['comm']}) of {where} ran {t['cpu_rate']:.2f} CPUs' worth and "
                                "no plan places it",
                {"pid": t["pid"], "tid": t["tid"], "process": t["process"], "role": t["role"],
                 "cpus": t["cpus"], "cpu_rate": t["cpu_rate"]},
                "keep it off the workers' CPUs (a front end's CPUs), or name its process a worker "
                "(--worker-pids/--worker-match) if it runs the model", "fault" if plan or snap.recorded_workers else "note"))
    serving = set(snap.serving)
    rest = sorted(set(snap.online) - serving)
    for f in snap.foreign:
        confined = f["confined"]
        out.append(Finding(
            "foreign", f"thread {f['tid']} ({f['comm']}) of process {f['pid']}, not the server's, ran "
                       f"{f['cpu_rate']:.2f} CPUs' worth on CPUs {format_cpulist(f['cpus'])}"
                       + (", all of them serving CPUs" if confined else f", last on CPU {f['last_cpu']}"),
            f, (f"move it off the serving CPUs: `tuna-lab audit --pid {master} --isolate` prints how"
                if confined and rest else "nothing to move it to: the server has every CPU; stop it, or give the "
                "server fewer CPUs" if not rest else "the scheduler may move it elsewhere; `--isolate` confines it"
                " when it is confined to serving CPUs"),
            "fault" if confined and rest else "note"))
    for irq in snap.irqs:
        if irq["rate"] < IRQ_RATE:
            continue
        movable = irq["affinity"] is not None and bool(rest)
        out.append(Finding(
            "irq", f"IRQ {irq['name']} ({irq['label']}) fired {irq['rate']:.0f}/s on serving CPUs "
                   f"{', '.join(irq['per_cpu'])}" + (f"; its affinity is {format_cpulist(irq['affinity'])}"
                                                      if irq["affinity"] is not None else ""),
            irq, (f"send it to CPUs {format_cpulist(rest)}: `tuna-lab audit --pid {master} --isolate`" if movable else
                  "a per-CPU interrupt, or no CPU outside the serving ones: it cannot be moved"),
            "fault" if movable and not set(irq["affinity"]) <= set(rest) else "note"))
    th = snap.throttling
    if th and th["nr_throttled"] > 0:
        out.append(Finding(
            "throttled", f"the server's cgroup ran out of its CPU quota ({th['quota_cpus']} CPUs' worth) "
                         f"{th['nr_throttled']} times in {snap.interval:g} s, stopped {th['throttled_seconds']:.3f} s",
            th, "raise the quota (cpu.max / cpu.cfs_quota_us) to at least the plan's CPUs, or plan for the quota "
                "(tuna-lab plan on fewer CPUs)"))
    planned_cpus = set(plan["topology"]["cpus"]) if plan else serving
    for kind, cpus, why in (("offline", sorted(planned_cpus - set(snap.online)), "offline"),
                            ("isolated", sorted(planned_cpus & set(snap.isolated)), "isolated from the scheduler "
                                                                                    "(isolcpus)")):
        if cpus:
            out.append(Finding(kind, f"CPU{'s' if len(cpus) > 1 else ''} {format_cpulist(cpus)} of the plan "
                                     f"{'are' if len(cpus) > 1 else 'is'} {why}",
                               {"cpus": cpus}, "bring them online, or make the plan on the CPUs there are"
                               if kind == "offline" else "no load balancing there: threads stay where pinned; "
                               "plan on other CPUs, or pin every thread exactly"))
    tw = snap.threading
    if tw:
        # Threaded workers: W x K x T threads on C CPUs, and the knob that removes the oversubscription.
        out.append(Finding("threaded", tw["text"], tw, "fewer threads: " + (", ".join(tw["knobs"]) or "the "
                           "framework's thread-pool size and the runtime's thread count") if tw["oversubscribed"]
                           else "none needed: the threads fit the CPUs",
                           "fault" if tw["oversubscribed"] else "note"))
    return out


def _narrow(cpus, online):
    return bool(cpus) and not set(online) <= set(cpus)


def _overlaps(snap, plan, workers):
    """Pools of two workers that share CPUs the plan keeps apart (or any pinned overlap without a plan)."""
    claims, planned = {}, {}
    for t in snap.threads:
        if t["process"] != "worker" or t["role"] != "pool" or not _narrow(t["cpus"], snap.online):
            continue
        claims.setdefault(t["pid"], set()).update(t["cpus"])
        if t["planned"] is not None:
            planned.setdefault(t["pid"], set()).update(t["planned"])
    out = []
    pids = sorted(claims)
    for i, a in enumerate(pids):
        for b in pids[i + 1:]:
            shared = claims[a] & claims[b]
            # What the plan (or the pin) lets them share; without either, no overlap was meant.
            allowed = planned.get(a, set()) & planned.get(b, set())
            extra = sorted(shared - allowed)
            if extra:
                out.append(Finding(
                    "overlap", f"the pools of workers {a} and {b} share CPU{'s' if len(extra) > 1 else ''} "
                               f"{format_cpulist(extra)}" + ("" if a in planned or b in planned else
                                                            " (no plan says they should)"),
                    {"workers": [a, b], "cpus": extra, "pools": {str(a): sorted(claims[a]), str(b): sorted(claims[b])}},
                    "their threads take turns on those CPUs: pin the server again to its plan "
                    f"(tuna-lab pin --pid {snap.master} ...)"))
    return out


def _smt_split(snap, plan, workers):
    """Cores whose SMT siblings hold threads of workers the plan does not put on that core."""
    if plan is None or all(len(c) < 2 for c in snap.cores):
        return []
    out = []
    for core in snap.cores:
        if len(core) < 2:
            continue
        meant = {t["pid"] for t in snap.threads if t["planned"] and set(t["planned"]) <= set(core)}
        there = {t["pid"] for t in snap.threads if t["process"] == "worker" and _narrow(t["cpus"], snap.online)
                 and set(t["cpus"]) <= set(core)}
        strangers = sorted(there - meant)
        if strangers:
            out.append(Finding(
                "smt-split", f"core {format_cpulist(core)} (SMT siblings) holds threads of worker"
                             f"{'s' if len(strangers) > 1 else ''} {', '.join(map(str, strangers))}, which the plan "
                             "puts elsewhere" + (f"; the plan gives it to {', '.join(map(str, sorted(meant)))}"
                                                 if meant else ""),
                {"core": list(core), "workers": strangers, "planned_workers": sorted(meant)},
                "siblings share a core's caches and units: pin the server again to its plan"))
    return out


def _machine_findings(snap):
    """Machine-wide: user processes pinned to narrowed masks that overlap another's."""
    out = []
    rows = [p for p in snap.pinned if set(p["cpus"])]
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            shared = sorted(set(a["cpus"]) & set(b["cpus"]))
            if shared and a["cpu_rate"] >= BUSY_SHARE and b["cpu_rate"] >= BUSY_SHARE:
                out.append(Finding(
                    "overlap", f"processes {a['pid']} and {b['pid']}, both busy, are pinned to shared "
                               f"CPU{'s' if len(shared) > 1 else ''} {format_cpulist(shared)}",
                    {"pids": [a["pid"], b["pid"]], "cpus": shared},
                    "they take turns there: give each CPUs of its own (tuna-lab audit --pid MASTER for a server)"))
    return out


# -- isolation ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Move:
    """One change ``--isolate`` makes: a thread's mask (``kind="thread"``, ``pid``/``tid``) or an IRQ's affinity."""

    kind: str
    target: str
    pid: int
    before: tuple
    after: tuple
    why: str

    def command(self):
        """The shell command that makes this move by hand."""
        if self.kind == "thread":
            return f"taskset -p -c {format_cpulist(self.after)} {self.target}"
        return f"echo {format_cpulist(self.after)} > /proc/irq/{self.target}/smp_affinity_list"


def isolation_moves(snap, found=None):
    """The moves that take the ``foreign`` and ``irq`` faults off the serving CPUs (pure).

    Raises
    ------
    PinError
        The snapshot's rates were measured over less than :data:`SOUND_INTERVAL`: too short to act on.
    """
    snap = snap if isinstance(snap, Snapshot) else Snapshot(**snap)
    if snap.interval < SOUND_INTERVAL:
        raise PinError(f"rates measured over {snap.interval:.3g} s are too few clock ticks to act on: --isolate "
                       f"needs an --interval of at least {SOUND_INTERVAL:g} s")
    found = findings(snap) if found is None else found
    serving = set(snap.serving)
    rest = tuple(sorted(set(snap.online) - serving))
    moves = []
    for f in found:
        if f.severity != "fault":
            continue
        if f.kind == "foreign":
            after = tuple(sorted(set(f.evidence["cpus"]) - serving)) or rest
            moves.append(Move("thread", str(f.evidence["tid"]), f.evidence["pid"], tuple(f.evidence["cpus"]), after,
                              f"thread {f.evidence['tid']} ({f.evidence['comm']}) off the serving CPUs"))
        elif f.kind == "irq":
            after = tuple(sorted(set(f.evidence["affinity"]) - serving)) or rest
            moves.append(Move("irq", f.evidence["name"], 0, tuple(f.evidence["affinity"]), after,
                              f"IRQ {f.evidence['name']} ({f.evidence['label']}) off the serving CPUs"))
    return moves


def isolation_warnings(serving=()):
    """What may undo ``--isolate``'s moves, one line each: an irqbalance daemon that is running.

    irqbalance rewrites every IRQ's ``smp_affinity`` on its own schedule (every
    10 s), so an IRQ moved off the serving CPUs may be put back on them. Found
    by its process name (``/proc/PID/comm``, :func:`~tuna_lab.machine.procfs.processes_named`).

    Examples
    --------
    >>> isolation_warnings([2, 3]) == [] or "irqbalance" in isolation_warnings([2, 3])[0]
    True
    """
    found = procfs.processes_named("irqbalance")
    if not found:
        return []
    pids = ", ".join(map(str, found))
    ban = f" or ban CPUs {format_cpulist(serving)} in its IRQBALANCE_BANNED_CPULIST" if serving else ""
    return [f"irqbalance is running (pid {pids}): it re-spreads IRQs on its own and undoes the IRQ moves of "
            f"--isolate; stop it (`systemctl stop irqbalance`){ban}"]


def isolation_record_path():
    """Where this user's isolation record is (or would be): ``isolation.json`` in the state folder
    (:func:`~tuna_lab.live.state.state_dir`), a record of the ledger (:mod:`tuna_lab.live.ledger`).

    Masks and IRQ affinities do not survive a reboot; the record names the
    boot it was made in, and another boot's is not read.
    """
    from .ledger import Record, isolation_record

    found = Record.load(isolation_record()).path
    return found or os.path.join(state_dir(), f"{isolation_record()}.json")


def apply_isolation(moves):
    """Make ``moves``, recording each in the ledger before it is made; return what failed, one line each.

    A move is recorded first, so that an apply killed half-way can still be
    undone; a move that fails is dropped from the record. A thread or IRQ
    moved already keeps its first ``before``. A signal (SIGINT, SIGTERM,
    SIGHUP, SIGUSR1) in the middle gives back what this apply changed, then
    ends it as a KeyboardInterrupt.
    """
    from .ledger import Change, Record, isolation_record, signals_give_back

    failed = []
    with state_lock(isolation_record()):
        record = Record.load(isolation_record())
        keys = []
        for mv in moves:
            if mv.kind == "thread":
                tid = int(mv.target)
                if not record.record_thread(mv.pid, tid, mv.before, mv.after):
                    failed.append(f"{mv.why}: the thread ended")
                    continue
                keys.append(("thread", str(tid), start_ticks(tid)))
            else:
                key = ("irq", str(mv.target), None)
                first = record.changes.get(key)
                record.changes[key] = Change("irq", str(mv.target), before=first.before if first else
                                             tuple(sorted(mv.before)), set=tuple(sorted(mv.after)))
                keys.append(key)
        record.save()
        bad = []
        try:
            with signals_give_back():
                for mv, key in zip([m for m in moves if _recorded(m, keys)], keys):
                    try:
                        if mv.kind == "thread":
                            bind(int(mv.target), mv.after)
                        else:
                            irq_reader.set_irq_affinity(mv.target, mv.after)
                    except (OSError, BindingError) as exc:
                        failed.append(f"{mv.why}: {getattr(exc, 'strerror', None) or exc}")
                        bad.append(key)
        except KeyboardInterrupt:
            record.forget(bad)
            record.give_back()
            raise
        if bad:
            record.forget(bad)
            record.save()
    return failed


def _recorded(move, keys):
    return any(k[0] == move.kind and k[1] == str(move.target) for k in keys)


def undo_isolation():
    """Give back every mask and IRQ affinity ``apply_isolation`` set, by the ledger's one rule.

    Returns
    -------
    GiveBack
        ``done``, ``left`` (kept in the record: someone changed it since, a
        TID now another thread's) and ``malformed`` (kept, and nothing hidden
        by them), one line each; ``path`` where the record is kept, if it is.
    """
    from .ledger import Record, isolation_record

    with state_lock(isolation_record()):
        return Record.load(isolation_record()).give_back()
