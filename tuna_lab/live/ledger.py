"""The ledger: every change tuna_lab makes to a running system, recorded once and given back by one rule.

Thread masks (``pin --pid``, ``run --pid``, ``--front-cpus``) and the moves of
``audit --isolate --apply`` (threads and IRQ affinities) are written here
*before* they are made, through :mod:`tuna_lab._files`, into this user's state
folder (:func:`~tuna_lab.live.state.state_dir`): one record per server
(``pins-MASTER-START.json``) and one for isolation (``isolation.json``); the
masks a server's own Gunicorn hooks (and the lab server's workers) set on
their own threads go to ``hooks-MASTER-START.json`` (:func:`bind_recorded`),
apart from ``pin --pid``'s: to ``pin``, ``unpin`` and ``run --pid`` they are
the server's own masks. Each
entry names the process (PID and start time), the thread (TID and its own
start time), the mask before tuna_lab's *first* change, and the mask set.

**The give-back rule** (:meth:`Record.give_back`): a mask goes back only to
the same thread - PID, TID and both start times match - whose mask is still
the one tuna_lab set. A thread born in a recorded process under a mask
tuna_lab set (it inherited it) is tuna_lab's to give back too: it gets the
process's mask from before the first change. Anything else is said in one
line and kept in the record. A malformed entry never hides the good ones:
they are given back, it is kept, and the caller exits non-zero.

Examples
--------
>>> Change.from_dict(Change("thread", "7", 7, 1, 1, (0, 1), (0,)).to_dict()).what()
'thread 7 of process 7'
"""

import contextlib
import os
import re
import signal
import threading
from dataclasses import dataclass, field

from .. import _files
from .._checks import format_cpulist
from ..errors import BindingError, PinError, UnsafeFileError
from ..machine import irqs as irq_reader
from ..machine import procfs
from ..machine.procfs import start_ticks
from .binding import affinity_of, bind, threads_of
from .state import state_dir, state_dirs, state_lock

__all__ = ["LEDGER_FORMAT", "Change", "Record", "GiveBack", "pins_record", "isolation_record", "pin_records",
           "record_pins", "signals_give_back", "Signalled", "FATAL_SIGNALS", "still_pinned", "hooks_record",
           "bind_recorded", "give_back_hooks"]

#: The ``format`` of every record file.
LEDGER_FORMAT = "tuna_lab.ledger/1"
_RECORD_BYTES = 16 << 20


@dataclass(frozen=True)
class Change:
    """One change: a thread's mask (``kind="thread"``: ``target`` its TID) or an IRQ's affinity (``"irq"``).

    ``pid``/``pid_started`` and ``tid_started`` (kernel start times, clock
    ticks since boot) name the process and the thread; ``before`` is the
    mask before tuna_lab's first change, ``set`` the one it set; ``slot`` a
    worker's slot (None: not a worker's thread).
    """

    kind: str
    target: str
    pid: int = None
    pid_started: int = None
    tid_started: int = None
    before: tuple = ()
    set: tuple = ()
    slot: int = None

    def key(self):
        return (self.kind, self.target, self.tid_started)

    def what(self):
        return f"thread {self.target} of process {self.pid}" if self.kind == "thread" else f"IRQ {self.target}"

    def to_dict(self):
        return {"kind": self.kind, "target": self.target, "pid": self.pid, "pid_started": self.pid_started,
                "tid_started": self.tid_started, "before": list(self.before), "set": list(self.set),
                "slot": self.slot}

    @classmethod
    def from_dict(cls, d):
        """The change ``d`` describes; ValueError (why) when it is malformed."""
        if not isinstance(d, dict) or d.get("kind") not in ("thread", "irq"):
            raise ValueError("not a thread or IRQ entry")
        masks = {}
        for name in ("before", "set"):
            value = d.get(name)
            if not isinstance(value, list) or not value or not all(type(c) is int and 0 <= c < 1 << 16
                                                                    for c in value):
                raise ValueError(f"its {name!r} mask is not a list of CPUs")
            masks[name] = tuple(sorted(set(value)))
        target = d.get("target")
        if not isinstance(target, str) or not target or len(target) > 64:
            raise ValueError("no target")
        ints = {}
        for name in ("pid", "pid_started", "tid_started", "slot"):
            value = d.get(name)
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"its {name!r} is not a number")
            ints[name] = value
        if d["kind"] == "thread" and (not target.isdigit() or None in (ints["pid"], ints["pid_started"],
                                                                       ints["tid_started"])):
            raise ValueError("a thread entry without its TID, process and both start times")
        return cls(d["kind"], target, ints["pid"], ints["pid_started"], ints["tid_started"], masks["before"],
                   masks["set"], ints["slot"])


@dataclass
class GiveBack:
    """What :meth:`Record.give_back` did: ``done``, ``left`` (kept in the record) and ``malformed``, one line
    each; ``path``, where the record is (None: nothing is kept)."""

    done: list = field(default_factory=list)
    left: list = field(default_factory=list)
    malformed: list = field(default_factory=list)
    path: str = None

    @property
    def ok(self):
        """Nothing malformed, nothing failed."""
        return not self.malformed and not any(line.endswith("(failed)") for line in self.left)


@dataclass
class Record:
    """One record file of the ledger: its changes, per process what tuna_lab saw, and what it could not read.

    ``processes`` is ``{pid: {"started", "slot", "seen": {tid: start}, "before"}}``: per process the
    threads it had when tuna_lab first changed it and its main thread's mask then (what a thread born
    since under tuna_lab's mask is given back). ``malformed`` holds the raw entries kept as they were.
    """

    name: str
    changes: dict = field(default_factory=dict)
    processes: dict = field(default_factory=dict)
    malformed: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    path: str = None

    # -- reading and writing ----------------------------------------------------------------------
    @classmethod
    def load(cls, name):
        """The record ``name`` (``pins-MASTER-START`` or ``isolation``) as found in this user's state folders.

        A file that is not ours to read (a link, a FIFO, too large, another
        boot's) is refused with :class:`PinError`; a malformed entry is
        kept apart (``malformed``) and never hides the good ones.
        """
        rec = cls(name)
        for folder in state_dirs():
            path = os.path.join(folder, f"{name}.json")
            try:
                saved = _files.read_json(path, limit=_RECORD_BYTES, follow=False)
            except FileNotFoundError:
                continue
            except UnsafeFileError as exc:
                raise PinError(f"the record {path} is refused: {exc}") from None
            rec.path = path
            if not isinstance(saved, dict) or saved.get("format") != LEDGER_FORMAT:
                rec.malformed.append(saved)
                rec.problems.append(f"{path} is not a record of tuna_lab's ledger: kept as it is")
                continue
            if saved.get("boot") != procfs.boot_id():
                continue                   # masks and IRQ affinities do not outlive a reboot
            entries = saved.get("entries") if isinstance(saved.get("entries"), list) else []
            for i, raw in enumerate(entries):
                try:
                    if isinstance(raw, dict) and raw.get("kind") == "process":
                        rec._load_process(raw)
                    else:
                        change = Change.from_dict(raw)
                        rec.changes[change.key()] = change
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    rec.malformed.append(raw)
                    rec.problems.append(f"entry {i + 1} of {path} is malformed ({exc}): kept, nothing given back "
                                        "by it")
            break
        return rec

    def _load_process(self, raw):
        pid, started_, slot = raw["pid"], raw["started"], raw.get("slot")
        seen = {int(t): int(s) for t, s in raw["seen"]}
        before = tuple(sorted(int(c) for c in raw["before"]))
        if type(pid) is not int or type(started_) is not int or (slot is not None and type(slot) is not int):
            raise ValueError("a process entry without its PID and start time")
        self.processes[pid] = {"started": started_, "slot": slot, "seen": seen, "before": before}

    def save(self):
        """Write the record (a new file renamed into place, 0600); remove it when it holds nothing."""
        entries = [c.to_dict() for c in self.changes.values()]
        entries += [{"kind": "process", "pid": pid, "started": p["started"], "slot": p["slot"],
                     "seen": sorted([t, s] for t, s in p["seen"].items()), "before": list(p["before"])}
                    for pid, p in self.processes.items()]
        entries += self.malformed
        path = self.path or os.path.join(state_dir(), f"{self.name}.json")
        if not self.changes and not self.malformed:
            with contextlib.suppress(FileNotFoundError):
                if _files.trusted_dir(os.path.dirname(path), {os.geteuid()}) is None:
                    os.unlink(path)
            self.path = None
            return None
        if self.path is None:
            _remove_dead(os.path.dirname(path))       # the records of servers that are gone, at a first pin
        _files.write_json(path, {"format": LEDGER_FORMAT, "boot": procfs.boot_id(), "entries": entries},
                          mode=0o600, durable=False, error=PinError)
        self.path = path
        return path

    # -- recording --------------------------------------------------------------------------------
    def note_process(self, pid, slot):
        """Remember process ``pid`` (its start time, slot, threads now and main mask) before its first change."""
        ticks = start_ticks(pid)
        if ticks is None:
            return None
        known = self.processes.get(pid)
        if known is None or known["started"] != ticks:
            try:
                main = tuple(sorted(affinity_of(pid)))
            except BindingError:
                return None
            if self.ours(pid, pid, main):
                main = self.change_of(pid, pid).before
            # The threads it has before tuna_lab's first change: any other is born since, under a mask
            # tuna_lab set or not (never added later: a thread born under our pin would pass for its own).
            seen = {tid: t0 for tid in threads_of(pid) if (t0 := start_ticks(tid)) is not None}
            known = {"started": ticks, "slot": slot, "seen": seen, "before": main}
            self.processes[pid] = known
        known["slot"] = slot
        return known

    def change_of(self, pid, tid):
        """The change recorded of thread ``tid`` of ``pid`` as it runs now (same start times); None if none."""
        t0 = start_ticks(tid)
        change = self.changes.get(("thread", str(tid), t0))
        if change is None or change.pid != pid or start_ticks(pid) != change.pid_started:
            return None
        return change

    def ours(self, pid, tid, now):
        """Whether thread ``tid`` of ``pid``, on mask ``now``, holds a mask tuna_lab set: recorded, or born
        since tuna_lab's first change of its process under one of the masks it set there."""
        change = self.change_of(pid, tid)
        if change is not None:
            return tuple(now) == change.set
        proc = self.processes.get(pid)
        if proc is None or start_ticks(pid) != proc["started"]:
            return False
        t0 = start_ticks(tid)
        if proc["seen"].get(tid) == t0:
            return False                   # it was there before tuna_lab changed anything: its mask is its own
        return tuple(now) in {c.set for c in self.changes.values() if c.kind == "thread" and c.pid == pid}

    def before_of(self, pid, tid, now):
        """The mask to record as thread ``tid``'s "before": the first one, never a mask tuna_lab set (pin over a
        pin: a thread born under the first pin gets its process's mask from before it)."""
        change = self.change_of(pid, tid)
        if change is not None:
            return change.before
        if self.ours(pid, tid, now):
            return self.processes[pid]["before"]
        return tuple(sorted(now))

    def record_thread(self, pid, tid, now, wanted, slot=None):
        """Record that thread ``tid`` of ``pid`` (on ``now``) gets ``wanted``; False if it is gone."""
        pid_t0, tid_t0 = start_ticks(pid), start_ticks(tid)
        if pid_t0 is None or tid_t0 is None or not procfs.thread_exists(pid, tid):
            return False
        before = self.before_of(pid, tid, now)
        self.changes[("thread", str(tid), tid_t0)] = Change("thread", str(tid), pid, pid_t0, tid_t0,
                                                            tuple(before), tuple(sorted(wanted)), slot)
        return True

    def forget(self, keys):
        for key in keys:
            self.changes.pop(key, None)

    # -- giving back ------------------------------------------------------------------------------
    def give_back(self, pids=None):
        """Give back every change (of processes ``pids`` only, if given) by the one rule; save what is kept.

        Returns
        -------
        GiveBack
        """
        out = GiveBack(malformed=list(self.problems))
        # Threads born under a mask tuna_lab set first, while every mask it set is still in the record.
        for pid, proc in list(self.processes.items()):
            if (pids is None or pid in pids) and start_ticks(pid) == proc["started"]:
                out.done += self._born_under_ours(pid, proc)
        mine = [c for c in self.changes.values() if pids is None or c.pid in pids]
        # IRQs and the front (slot None) first, then the workers by slot: the reverse of a pin's order.
        mine.sort(key=lambda c: (c.kind != "irq", c.slot is not None, c.slot or 0, int(c.pid or 0), c.target))
        for change in mine:
            line = self._give_back_one(change)
            if line is None:
                self.changes.pop(change.key())
                continue
            done, text = line
            if done:
                self.changes.pop(change.key())
                out.done.append(text)
            else:
                out.left.append(text)
                if text.endswith("(gone)"):
                    self.changes.pop(change.key())
        for pid in list(self.processes):
            if (pids is None or pid in pids) and not any(c.pid == pid for c in self.changes.values()):
                del self.processes[pid]
        out.path = self.save()
        return out

    def _give_back_one(self, change):
        what = change.what()
        try:
            if change.kind == "irq":
                now = tuple(sorted(irq_reader.irq_affinity(change.target) or ()))
                if now != change.set:
                    return False, (f"{what}: on CPUs {format_cpulist(now) or '?'}, not the "
                                   f"{format_cpulist(change.set)} tuna_lab set: someone changed it since; left")
                irq_reader.set_irq_affinity(change.target, change.before)
                return True, f"{what}: back on CPUs {format_cpulist(change.before)}"
            tid = int(change.target)
            if start_ticks(change.pid) != change.pid_started:
                return False, f"{what}: the process ended, nothing to give back (gone)"
            if not procfs.thread_exists(change.pid, tid) or start_ticks(tid) != change.tid_started:
                # Its TID may be another thread's now, or another process's: never touched.
                return False, f"{what}: the thread ended, nothing to give back (gone)"
            now = tuple(sorted(affinity_of(tid)))
            if now != change.set:
                return False, (f"process {change.pid}: thread {tid} is on CPUs {format_cpulist(now)}, not the "
                           f"{format_cpulist(change.set)} tuna_lab set: someone else changed its mask since; "
                           "left as it is")
            bind(tid, change.before)
            return True, f"{what}: back on CPUs {format_cpulist(change.before)}"
        except BindingError as exc:
            if change.kind == "thread" and not procfs.thread_exists(change.pid, int(change.target)):
                return None
            return False, f"{what}: {exc} (failed)"
        except OSError as exc:
            return False, f"{what}: {exc.strerror or exc} (failed)"

    def _born_under_ours(self, pid, proc):
        """Give threads born in ``pid`` since its first change, on a mask tuna_lab set, its mask from before."""
        out = []
        for tid in threads_of(pid):
            if any(c.target == str(tid) and c.pid == pid for c in self.changes.values()):
                continue
            try:
                now = tuple(sorted(affinity_of(tid)))
                if self.ours(pid, tid, now):
                    bind(tid, proc["before"])
                    out.append(f"thread {tid} of process {pid} (born under tuna_lab's mask): back on CPUs "
                               f"{format_cpulist(proc['before'])}")
            except BindingError:
                continue
        return out


def _remove_dead(folder):
    """Remove ``pins-PID-START.json`` and ``hooks-PID-START.json`` (and their locks) of servers that are gone
    from this user's ``folder``."""
    pattern = re.compile(r"(?:pins|hooks)-(\d+)-(\d+)\.(json|lock)")
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            match = pattern.fullmatch(name)
            if match and not procfs.alive(int(match[1]), int(match[2])):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))


# -- the records of the commands ------------------------------------------------------------------

def pins_record(master):
    """The name of the record of server ``master``'s pins (its PID and start time); PinError if it is gone."""
    ticks = start_ticks(master)
    if ticks is None:
        raise PinError(f"no process with PID {master}")
    return f"pins-{int(master)}-{ticks}"


def hooks_record(master):
    """The name of the record of the masks server ``master``'s own hooks set (its PID and start time).

    Apart from :func:`pins_record`: ``pin --pid``, ``unpin --pid`` and
    ``run --pid`` take the hooks' masks as the server's own (what it was
    deployed with), and give back to them, never past them.
    """
    ticks = start_ticks(master)
    if ticks is None:
        raise PinError(f"no process with PID {master}")
    return f"hooks-{int(master)}-{ticks}"


def isolation_record():
    """The name of the record of ``audit --isolate --apply``'s moves."""
    return "isolation"


@contextlib.contextmanager
def open_pins(master):
    """The pin record of ``master``, locked against another command changing the same server's masks."""
    name = pins_record(master)
    with state_lock(name):
        yield Record.load(name)


def pin_records(master):
    """A view of what ``pin --pid`` (or ``run --pid``) recorded of server ``master``; empty when none.

    ``{"workers": {pid: {"started", "slot", "seen"}}, "threads": {tid: {"pid", "before", "set",
    "tid_started"}}}`` of the well-formed entries (a master that is gone has none).

    Examples
    --------
    >>> pin_records(os.getpid())
    {'workers': {}, 'threads': {}}
    """
    try:
        rec = Record.load(pins_record(master))
    except PinError:
        return {"workers": {}, "threads": {}}
    workers = {pid: {"started": p["started"], "slot": p["slot"], "seen": sorted(p["seen"])}
               for pid, p in rec.processes.items()}
    threads = {int(c.target): {"pid": c.pid, "before": list(c.before), "set": list(c.set),
                               "tid_started": c.tid_started}
               for c in rec.changes.values() if c.kind == "thread"}
    return {"workers": workers, "threads": threads}


def record_pins(record, pid, slot, intent):
    """Record (and save) that tuna_lab sets ``intent`` (``{tid: (mask now, mask to set)}``) on ``pid``'s threads.

    Written *before* the threads are bound, so that a pin killed half-way can
    still be given back. A thread recorded already keeps its first ``before``.
    """
    if record.note_process(pid, slot) is None:
        return
    for tid, (now, wanted) in intent.items():
        record.record_thread(pid, tid, now, wanted, slot)
    record.save()


def still_pinned(threads):
    """Whether a thread of a pin record (:func:`pin_records`' ``threads``) is still on the mask tuna_lab set.

    A pin in effect, not a kept entry: the ledger keeps an entry it could not
    give back - a mask someone else changed since - and says so at each
    ``unpin``; such a thread is no longer on a mask of ours, so it does not
    make the server pinned. A thread that ended does not either, nor another
    thread that took its TID since (its start time, where the entry has it,
    is not the recorded one): the ledger's "same thread" test.

    Examples
    --------
    >>> me = {"set": sorted(os.sched_getaffinity(0)), "tid_started": start_ticks(os.getpid())}
    >>> still_pinned({os.getpid(): me}), still_pinned({os.getpid(): {**me, "tid_started": -1}}), still_pinned({})
    (True, False, False)
    """
    for tid, entry in threads.items():
        try:
            started = entry.get("tid_started")
            if started is not None and start_ticks(int(tid)) != started:
                continue                    # another thread on a reused TID: not the one tuna_lab pinned
            if sorted(affinity_of(int(tid))) == sorted(entry["set"]):
                return True
        except BindingError:
            continue                        # the thread ended
    return False


def bind_recorded(master, plan, slot, pool, *, exact_main=True):
    """Bind this worker's main thread and ``pool`` to ``slot`` of ``plan``, each mask in the ledger first.

    What the Gunicorn hooks' ``post_worker_init`` and the lab server's
    worker (:func:`tuna_lab.server.pinning.pin_worker`) call: the binding is
    :func:`~tuna_lab.live.binding.bind_worker`'s, the record
    :func:`hooks_record` of ``master``, written (locked, in this user's state
    folder: under Gunicorn's ``user =``, the workers' user's) before any
    mask changes. Entries of workers that are gone (a replacement takes
    their slot) are dropped from it at the same time. A thread whose binding
    failed is not kept: its mask is not one tuna_lab set.

    Returns
    -------
    (list of ThreadBinding, str or None)
        The bindings, and None - or one line saying why the masks are not in
        the ledger (no private state folder, a record refused): they are
        bound all the same, being the worker's own threads, which end with it.
    """
    from .binding import bind_worker

    pid = os.getpid()
    dry = bind_worker(plan, slot, pool, pid, exact_main=exact_main, dry_run=True)
    intent = {b.tid: (b.cpus, b.planned) for b in dry if b.error is None}
    try:
        name = hooks_record(master)
        with state_lock(name):
            record = Record.load(name)
            gone = {c.pid for c in record.changes.values()
                    if c.kind == "thread" and c.pid != pid and start_ticks(c.pid) != c.pid_started}
            gone |= {p for p, known in record.processes.items() if p != pid and start_ticks(p) != known["started"]}
            if gone:
                record.give_back(gone)      # nothing to give back: their entries go
            record_pins(record, pid, slot, intent)
            bound = bind_worker(plan, slot, pool, pid, exact_main=exact_main)
            failed = {b.tid for b in bound if b.error is not None}
            if failed:
                record.forget([k for k, c in record.changes.items() if c.kind == "thread" and c.pid == pid
                               and int(c.target) in failed])
                record.save()
            return bound, None
    except (PinError, OSError) as exc:
        problem = f"the masks of worker {pid} are not recorded in tuna_lab's ledger ({exc})"
    return bind_worker(plan, slot, pool, pid, exact_main=exact_main), problem


def give_back_hooks(master, pids=None):
    """Give back, by the one rule, the masks server ``master``'s hooks set (of workers ``pids`` only, if given).

    Called by the hooks when a worker exits (``worker_exit`` in the worker,
    ``child_exit`` in the master) and when the server stops (``on_exit``):
    a worker that is gone has nothing to give back, and its entries go; a
    live one gets its masks back where they are still the ones set. Makes
    nothing in the state folder when this user has no such record; when the
    server stops (``pids`` None) and nothing is kept, its lock goes too.

    Returns
    -------
    GiveBack or None
        None: no record (or ``master`` is gone).
    """
    try:
        name = hooks_record(master)
    except PinError:
        return None
    given = None
    if any(os.path.lexists(os.path.join(folder, f"{name}.json")) for folder in state_dirs()):
        with state_lock(name):
            given = Record.load(name).give_back(None if pids is None else set(pids))
    if pids is None and (given is None or given.path is None):
        # The server stops and its workers are gone: no one takes this lock again (it would otherwise wait
        # for the next server's first pin to be swept away).
        for folder in state_dirs():
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, f"{name}.lock"))
    return given


# -- signals --------------------------------------------------------------------------------------

#: The signals a command that changes masks gives them back on: each would otherwise end the process
#: without a word (SIGHUP: a closed terminal, a dropped SSH session; SIGUSR1's default is to end it too).
FATAL_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1")


class Signalled(KeyboardInterrupt):
    """Raised in the main thread by a signal :func:`signals_give_back` caught; ``signal`` is its name."""

    def __init__(self, name):
        super().__init__(f"signal {name}")
        self.signal = name


@contextlib.contextmanager
def signals_give_back(names=FATAL_SIGNALS):
    """While in the block, SIGINT, SIGTERM, SIGHUP and SIGUSR1 (or ``names``) raise :class:`Signalled` (a
    KeyboardInterrupt) in the main thread, so that the caller's ``finally`` gives the masks back; the
    handlers before are restored after.

    A signal whose handler is not the default (a caller's own) is left as it is, but for SIGTERM and a
    handler that itself only unwinds (the CLI's, marked ``unwinds_as_interrupt``): those give the masks
    back like the rest.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def interrupt(signum, frame):
        raise Signalled(signal.Signals(signum).name)

    for name in names:
        sig = getattr(signal, name)
        handler = signal.getsignal(sig)
        if (handler in (signal.SIG_DFL, signal.default_int_handler) or name == "SIGTERM"
                or getattr(handler, "unwinds_as_interrupt", False)):
            previous[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
