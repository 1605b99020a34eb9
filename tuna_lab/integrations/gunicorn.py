"""Pin your own Gunicorn server: four hooks (and an optional fifth) for an existing ``gunicorn.conf.py``.

Add to the config of any pre-fork WSGI app (Flask, Django, plain WSGI) whose
workers run XGBoost or another OpenMP library::

    from tuna_lab.integrations.gunicorn import post_fork, post_worker_init, child_exit, on_exit, worker_exit

and say what to apply, in the environment or in the config before that line:

* ``TUNA_LAB_PLAN``: a plan file from ``tuna-lab plan ... > plan.json`` (or the
  plan's JSON itself, as the ``gunicorn`` format of ``tuna-lab plan`` writes); or
* ``TUNA_LAB_POLICY`` and ``TUNA_LAB_THREADS``: a policy (``tuna-scatter``,
  ``round-robin`` ...) and the OpenMP threads of each worker; the plan is then
  made on this machine for the configured number of workers (the solver runs
  in a separate process, so neither the master nor a worker loads it).

:func:`configure` sets the same from Python. ``TUNA_LAB_FORCE=1`` applies a
plan made on another machine. ``TUNA_LAB_MEASURE_ONLY=1`` places nothing,
whatever the rest says: the hooks then only time each request (what
``tuna-lab run --app --server-conf`` sets for ``cfs``, which leaves
placement to the kernel, when your config holds these hooks).

What each worker does:

1. ``post_fork``: takes the lowest free *slot* (a lock file per slot, held for
   the worker's life: the kernel frees it when the worker dies, so a
   replacement takes its predecessor's slot), and sets ``OMP_PLACES`` if no
   OpenMP runtime is loaded yet, so that libgomp keeps its pool size once the
   main thread is pinned.
2. ``post_worker_init`` (the app is loaded): wakes the OpenMP pool once by
   running an empty parallel region of ``T`` threads in every loaded libgomp,
   takes the TIDs that appear as the pool (ranked by creation), and binds the
   main thread and each pool thread by TID to the slot's CPUs, reading each
   binding back. If the app already started its pool, the pool threads are
   found as ``tuna-lab pin --pid`` finds them. Every mask is written in
   tuna_lab's ledger before it is set (:func:`~tuna_lab.live.ledger.bind_recorded`:
   the record ``hooks-MASTER-START`` of the worker's user). And it wraps the
   worker's app in :class:`~tuna_lab.integrations.timing.SchedTiming`: each
   response carries the request's scheduler evidence (``tuna-*`` metrics in
   ``Server-Timing``), which ``tuna-lab run`` stores per request, as for the
   lab server (``TUNA_LAB_SERVER_TIMING=0`` leaves the app unwrapped).
3. ``child_exit`` (master): gives back the exited worker's masks by the
   ledger's one rule (it is gone: its entries go); when it is replaced, logs
   that its slot goes to the replacement (nothing on a normal shutdown).
4. ``on_exit`` (master, Gunicorn stops): gives back what the ledger still
   holds of this server, and removes the hooks' state folder.
5. ``worker_exit`` (worker, optional): a worker that stops gives its own
   masks back by the same rule - what ``child_exit`` cannot do under
   Gunicorn's ``user =``, where the ledger is the workers' user's and the
   master (root) leaves it alone.

The master is never pinned. Only Gunicorn's ``sync`` worker class (or a
class made from it) is supported; any other is refused when the first
worker starts. A config that binds its workers itself, after a warm-up of
its own (tuna_lab's lab server), takes ``post_fork``, ``child_exit`` and
``on_exit`` from here and calls :func:`worker_slot` and :func:`record_slot`
from its own ``post_worker_init``.

The hooks keep their state (the plan, the slot locks, each worker's slot
record) in ``$TMPDIR/tuna_lab-gunicorn-UID-MASTER-START``, made whole by the
first worker's ``post_fork`` as the master's user and refused if anyone else
made it. Under Gunicorn's ``user =`` it stays the master's user's (root's):
only its ``records`` subfolder is handed to the workers' user, so that user
can plant no link where ``post_fork`` writes as root. The masks the workers
set are not kept there but in the ledger of the user they run as
(:func:`~tuna_lab.live.state.state_dir`), which root never reads or writes.

If your config already defines one of these hooks, call ours from yours::

    from tuna_lab.integrations import gunicorn as tuna_lab_hooks

    def post_worker_init(worker):
        tuna_lab_hooks.post_worker_init(worker)
        ...  # your own code
"""

import fcntl
import json
import os
import subprocess
import sys

__all__ = ["post_fork", "post_worker_init", "child_exit", "on_exit", "worker_exit", "configure", "worker_slot",
           "record_slot", "time_requests", "SUPPORTED_WORKER_CLASSES"]

#: Worker classes whose workers serve one request at a time on their main thread (and their subclasses).
SUPPORTED_WORKER_CLASSES = ("sync",)

# Gunicorn's exit code for a worker that failed to boot: the master then stops.
_BOOT_ERROR = 3

# This worker's slot, its lock (held open for the worker's life) and how its main thread may be pinned.
_worker = {"slot": None, "lock": None, "exact_main": False, "plan": None, "run_dir": None}


def configure(policy=None, threads=None, plan=None, force=False):
    """Say what to apply, from ``gunicorn.conf.py`` (the same as the ``TUNA_LAB_*`` variables).

    Parameters
    ----------
    policy : str, optional
        A registered policy (:func:`tuna_lab.placement.policy_names`).
    threads : int, optional
        OpenMP threads per worker (with ``policy``).
    plan : str or Plan, optional
        A plan, the path of a plan file, or a plan's JSON.
    force : bool
        Apply a plan made on another machine.

    Examples
    --------
    >>> # Skipped as a doctest: it sets TUNA_LAB_* in this process's environment, for Gunicorn's hooks.
    >>> configure(policy="round-robin", threads=2)        # doctest: +SKIP
    """
    if plan is not None:
        os.environ["TUNA_LAB_PLAN"] = plan if isinstance(plan, str) else json.dumps(plan.to_dict())
    if policy is not None:
        os.environ["TUNA_LAB_POLICY"] = str(policy)
    if threads is not None:
        os.environ["TUNA_LAB_THREADS"] = str(threads)
    if force:
        os.environ["TUNA_LAB_FORCE"] = "1"


def _measure_only():
    """Whether ``TUNA_LAB_MEASURE_ONLY=1`` says: place nothing, time the requests only."""
    return os.environ.get("TUNA_LAB_MEASURE_ONLY") == "1"


def _refuse(server, message):
    # Every worker of the first batch refuses, but one line in the log says it:
    # the first to create the marker writes it, with Gunicorn's own logger.
    from .._files import open_new
    from ..errors import TunaError

    try:
        os.close(open_new(os.path.join(_run_dir(server.pid, _owner(server)), "refused")))
    except FileExistsError:
        sys.exit(_BOOT_ERROR)
    except (TunaError, OSError):
        pass                                           # no folder to mark: each worker says it
    server.log.error("tuna_lab: %s", message)
    sys.exit(_BOOT_ERROR)


def _run_dir(master, owner=None):
    """The hooks' state folder for ``master``: made now if absent, refused unless this server made it.

    Runs in ``post_fork``, with the master's effective user (root, when
    Gunicorn's ``user``/``group`` drop the workers to another). The folder
    is that user's for its whole life, so that no other user (the workers'
    included) can plant a link where the hooks write as root; only its
    ``records`` subfolder is handed to ``owner`` (``(uid, gid)`` of the
    workers' user, or None), for the slot records a worker writes after the
    drop. It is made whole under a temporary name - marker
    (:func:`~tuna_lab.live.state.hook_mark`) and subfolder included -
    then renamed into place: a folder at the name without this server's
    marker was made by someone else, and is refused whoever owns it.
    """
    import shutil
    import tempfile

    import psutil

    from .._files import open_new
    from ..errors import PlanError
    from ..live.state import HOOK_MARK, HOOK_RECORDS, hook_dir, hook_dir_problem, hook_mark, remove_dead_state

    path = hook_dir(master)
    if not os.path.lexists(path):
        remove_dead_state("gunicorn", psutil.Process(master).uids().real)     # hook_dir's user
        new = tempfile.mkdtemp(prefix=os.path.basename(path) + ".", dir=os.path.dirname(path))
        try:
            fd = open_new(os.path.join(new, HOOK_MARK), mode=0o644)
            with os.fdopen(fd, "w") as fh:
                fh.write(hook_mark(master))
            records = os.path.join(new, HOOK_RECORDS)
            os.mkdir(records, 0o700)
            if owner is not None:
                os.chown(records, owner[0], owner[1])
                os.chmod(new, 0o711)                   # the workers' user may pass through, not list or write
            os.rename(new, path)
        except OSError:
            pass                                       # another worker's came first (or failed): checked below
        finally:
            shutil.rmtree(new, ignore_errors=True)
    why = hook_dir_problem(path, master, os.geteuid())
    if why:
        raise PlanError(f"refusing the state folder {path}: {why}; another user may have created it "
                        "at this name - remove it and restart the server")
    return path


def _owner(server):
    """``(uid, gid)`` the workers drop to with Gunicorn's ``user``/``group``; None if they keep the master's."""
    uid, gid = getattr(server.cfg, "uid", None), getattr(server.cfg, "gid", None)
    if uid is None or uid == os.geteuid():
        return None
    return int(uid), int(gid if gid is not None else os.getegid())


def worker_slot():
    """``(slot, plan)``: the slot this worker took in :func:`post_fork` and the server's plan.

    ``(None, plan)`` when every slot was taken (more workers than the plan's),
    ``(None, None)`` before :func:`post_fork`. For a config whose own
    ``post_worker_init`` binds the worker (the lab server's, after its warm-up).
    """
    return _worker["slot"], _worker["plan"]


def record_slot(exact_main):
    """Say which slot this worker holds and how its main thread is bound, for `tuna-lab status/pin --pid`.

    Called after Gunicorn dropped the worker to its ``user`` (from
    ``post_worker_init``): written as that user, into the subfolder it was handed.
    """
    from ..live.state import HOOK_RECORDS, write_hook_record

    write_hook_record(os.path.join(_worker["run_dir"], HOOK_RECORDS), _worker["slot"], os.getpid(), exact_main)


def _make_plan(workers):
    """The plan for ``workers`` workers, from TUNA_LAB_PLAN or TUNA_LAB_POLICY + TUNA_LAB_THREADS."""
    from .._checks import positive_int
    from ..errors import PlanError
    from ..machine import topology_from
    from ..placement.plan import Plan

    here = topology_from(None)
    if os.environ.get("TUNA_LAB_PLAN"):
        plan = Plan.read(os.environ["TUNA_LAB_PLAN"])
        return plan.check_machine(here, force=os.environ.get("TUNA_LAB_FORCE") == "1")
    policy = os.environ.get("TUNA_LAB_POLICY")
    if not policy:
        raise PlanError("set TUNA_LAB_PLAN, or TUNA_LAB_POLICY and TUNA_LAB_THREADS, before importing "
                        "tuna_lab.integrations.gunicorn")
    text = os.environ.get("TUNA_LAB_THREADS", "")
    threads = positive_int("TUNA_LAB_THREADS", int(text) if text.strip().isdigit() else text, PlanError)
    from ..placement import get_policy, placement

    if get_policy(policy).needs_solver:
        # The solver stays out of the server: a worker forked from a master that
        # imported cvxpy would carry it for its whole life.
        done = subprocess.run([sys.executable, "-m", "tuna_lab", "plan", "-w", str(workers), "-t", str(threads),
                               "--policy", policy, "--format", "json"], capture_output=True, text=True)
        if done.returncode != 0:
            raise PlanError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "tuna-lab plan failed")
        return Plan.read(done.stdout)
    return placement(policy, workers, threads, here).plan()


def _shared_plan(run_dir, workers):
    """The server's plan, made by its first worker and read by the others (under a lock)."""
    from ..placement.plan import Plan

    path = os.path.join(run_dir, "plan.json")
    # The folder is the master's user's alone (see _run_dir): nothing else can be at these names.
    fd = os.open(os.path.join(run_dir, "plan.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.lexists(path):
            # Made by this server's first worker; still checked against this machine, as any plan is.
            from ..machine import topology_from

            return Plan.read(path, follow=False).check_machine(topology_from(None),
                                                               force=os.environ.get("TUNA_LAB_FORCE") == "1")
        plan = _make_plan(workers)
        plan.write(path)
        return plan


def _take_slot(run_dir, workers):
    """The lowest slot whose lock no live worker holds; the lock stays held until this process exits."""
    for slot in range(workers):
        fd = os.open(os.path.join(run_dir, f"slot-{slot}.lock"),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return slot, fd
    return None, None


def _supported(cfg):
    """Whether Gunicorn's worker class is ``sync`` or one made from it (one request at a time, main thread)."""
    if getattr(cfg, "worker_class_str", "sync") in SUPPORTED_WORKER_CLASSES:
        return True
    try:
        from gunicorn.workers.sync import SyncWorker

        return issubclass(cfg.worker_class, SyncWorker)
    except Exception:                                  # a class Gunicorn cannot load is refused here
        return False


def post_fork(server, worker):
    """Gunicorn hook (worker, right after the fork): check the worker class, take a slot, prepare OpenMP."""
    from .._checks import one_line
    from ..errors import TunaError
    from ..placement.plan import PinnedBy
    from ..live.pools import openmp_loaded
    from ..live.runtimes import openmp_unbound, places_counted

    if _measure_only():
        return                                         # no slot, no plan, OpenMP's variables left as they are
    kind = getattr(server.cfg, "worker_class_str", "sync")
    if not _supported(server.cfg):
        _refuse(server, f"worker class {kind!r} is not supported: tuna_lab pins 'sync' workers "
                "(one request at a time on the main thread); use worker_class = \"sync\"")
    try:
        run_dir = _run_dir(server.pid, _owner(server))
    except (TunaError, OSError) as exc:
        # No folder to leave a one-line marker in: each worker says it, and the master halts.
        server.log.error("tuna_lab: %s", one_line(exc))
        sys.exit(_BOOT_ERROR)
    try:
        plan = _shared_plan(run_dir, server.cfg.workers)
    except (TunaError, OSError, ValueError) as exc:
        _refuse(server, one_line(exc))
    if plan.workers != server.cfg.workers:
        _refuse(server, f"the plan has {plan.workers} slots but the server runs {server.cfg.workers} workers")
    slot, fd = _take_slot(run_dir, plan.workers)
    # libgomp reads OMP_PLACES once, when it loads; with a place list it counts CPUs
    # from it instead of from the calling thread's current affinity, so pinning
    # the main thread to one CPU does not shrink the pool XGBoost asks for.
    # Under OMP_PROC_BIND=false libgomp ignores OMP_PLACES. Only for a plan tuna_lab binds:
    # with OMP_PLACES alone libgomp binds its threads itself, which a plan that pins nothing must not.
    unbound = openmp_unbound(os.environ)
    exact = places_counted(os.environ)
    if not exact and not unbound and plan.pinned_by == PinnedBy.TUNA_LAB and not openmp_loaded():
        os.environ["OMP_PLACES"] = "threads"
        exact = True
    _worker.update(slot=slot, lock=fd, exact_main=exact, plan=plan, run_dir=run_dir)
    worker.tuna_slot = slot


def time_requests(worker):
    """Wrap ``worker``'s app in :class:`~tuna_lab.integrations.timing.SchedTiming` (once), unless
    ``TUNA_LAB_SERVER_TIMING=0``: each response then carries its request's ``tuna-*`` Server-Timing metrics.

    :func:`post_worker_init` calls it; a config of its own that pins nothing may call it from its
    ``post_worker_init`` to send the same evidence.
    """
    from .timing import SchedTiming

    app = getattr(worker, "wsgi", None)
    if os.environ.get("TUNA_LAB_SERVER_TIMING", "1") == "0" or app is None or isinstance(app, SchedTiming):
        return
    worker.wsgi = SchedTiming(app)


def post_worker_init(worker):
    """Gunicorn hook (worker, app loaded): time each request's threads, wake the OpenMP pool, bind main and
    pool threads by TID (each mask in the ledger first)."""
    import psutil

    from ..live.ledger import bind_recorded
    from ..placement.plan import PinnedBy
    from ..live.pools import pool_threads, wake_openmp

    log = worker.log
    time_requests(worker)
    if _measure_only():
        return
    plan, slot = _worker["plan"], _worker["slot"]
    pid = os.getpid()
    if plan is None or slot is None:
        log.warning("tuna_lab: worker %s has no slot (more workers than the plan's %s?): left unpinned",
                    pid, plan.workers if plan else "?")
        return
    # Recorded now, as the workers' user (post_fork runs as the master's: it writes no record).
    record_slot(False)
    if plan.pinned_by == PinnedBy.NONE:
        log.info("tuna_lab: worker %s slot %s: policy %s pins nothing", pid, slot, plan.policy)
        return
    before = {t.id for t in psutil.Process(pid).threads()}
    libs = wake_openmp(plan.threads) if plan.threads > 1 else []
    # The threads the wake-up started; if the app had started its pool already, found as `pin --pid` finds it.
    pool = pool_threads(pid, before) if plan.threads > 1 else []
    # An app that loads its OpenMP runtime later (on its first request) builds its places
    # then, from the main thread's CPUs at that moment: a single CPU would leave no pool.
    exact = plan.threads == 1 or (_worker["exact_main"] and bool(libs))
    record_slot(exact)
    bound, problem = bind_recorded(_master(worker), plan, slot, pool, exact_main=exact)
    if problem:
        log.warning("tuna_lab: worker %s slot %s: %s; pinned all the same (its threads end with it)", pid, slot,
                    problem)
    for b in bound:
        if b.error:
            log.error("tuna_lab: worker %s slot %s: %s (the worker keeps serving)", pid, slot, b.error)
    if plan.threads > 1 and len(pool) < plan.threads - 1:
        log.warning("tuna_lab: worker %s slot %s found %d pool thread(s) for T=%d (OpenMP runtimes: %s)",
                    pid, slot, len(pool), plan.threads, ", ".join(map(os.path.basename, libs)) or "none loaded")
    log.info("tuna_lab: worker %s slot %s (%s): %s", pid, slot, plan.policy,
             ", ".join(f"{b.role} {b.tid} -> {','.join(map(str, b.cpus))}" for b in bound if not b.error))


def _master(worker):
    """The PID of ``worker``'s master (Gunicorn's ``ppid``)."""
    return int(getattr(worker, "ppid", None) or os.getppid())


def _give_back(server, master, pids=None):
    """Give back by the ledger's one rule what server ``master``'s hooks set (of ``pids``); never raises.

    Each line it could not give back goes to Gunicorn's log, with where the record keeps it.
    """
    from .._checks import one_line
    from ..errors import TunaError
    from ..live.ledger import give_back_hooks

    try:
        given = give_back_hooks(master, pids)
    except (TunaError, OSError) as exc:
        server.log.warning("tuna_lab: the masks of server %s were not given back: %s", master, one_line(exc))
        return
    if given is None:
        return
    for line in given.left + given.malformed:
        if not line.endswith("(gone)"):
            server.log.warning("tuna_lab: %s", line)
    if given.path and not given.ok:
        server.log.warning("tuna_lab: what could not be given back is kept in %s", given.path)


def worker_exit(server, worker):
    """Gunicorn hook (worker, it stops): give this worker's masks back by the ledger's one rule (optional).

    The worker's threads are still there: each on the mask the hooks set gets
    its mask from before. Under Gunicorn's ``user =`` this is the only give-back
    of a worker that stops in order (the master, root, leaves the workers'
    user's ledger alone); the entries of one that was killed go when its
    replacement records its own, or with the server's record at the next
    server's first pin.
    """
    if not _measure_only():
        _give_back(server, _master(worker), {os.getpid()})


def child_exit(server, worker):
    """Gunicorn hook (master, a worker exited): give back its masks, its slot's lock is free for the replacement.

    The worker is gone, so nothing is given back: its entries leave the ledger
    (by the one rule). Skipped under Gunicorn's ``user =``: the ledger is then
    the workers' user's, which the master (root) does not touch. That the slot
    goes to a replacement is said only when the master will start one: not
    while it stops (Gunicorn closes its listeners first), nor when it runs
    fewer workers now (``TTOU``, or the old workers of a reload).
    """
    import psutil

    from ..live.state import hook_dir, hook_dir_problem

    if _measure_only():
        return                                         # nothing was set, and no slot was taken
    if _owner(server) is None:
        _give_back(server, server.pid, {worker.pid})
    if not _replaced(server):
        return
    try:
        path = hook_dir(server.pid)
        if hook_dir_problem(path, server.pid, os.geteuid()) or os.path.lexists(os.path.join(path, "refused")):
            return                                     # the workers say why, and the server is stopping
    except (psutil.Error, OSError):
        return

    server.log.info("tuna_lab: worker %s exited; its slot goes to its replacement", worker.pid)


def _replaced(server):
    """Whether the master will start a worker for the one it just reaped (``child_exit`` runs after the reap)."""
    return bool(getattr(server, "LISTENERS", None)) and len(server.WORKERS) < server.num_workers


def on_exit(server):
    """Gunicorn hook (master, the server stops): give back what the ledger still holds of this server's hooks
    (by its one rule; not under ``user =``, see :func:`child_exit`), and remove the hooks' state folder, if
    this server made it.

    A folder left by a killed master is removed by the next server of the
    same user that starts (:func:`~tuna_lab.live.state.remove_dead_state`);
    its ledger record at the next server's first pin.
    """
    import shutil

    import psutil

    from ..live.state import hook_dir, hook_dir_problem

    if _measure_only():
        return                                         # nothing was set, and no folder made
    if _owner(server) is None:
        _give_back(server, server.pid)
    try:
        path = hook_dir(server.pid)
        if hook_dir_problem(path, server.pid, os.geteuid()) is None:
            shutil.rmtree(path, ignore_errors=True)    # never follows a link inside it
    except (psutil.Error, OSError):
        pass
