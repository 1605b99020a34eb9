"""Gunicorn configuration (``-c python:tuna_lab.server.gunicorn_conf``): workers pinned by slot.

The launcher writes its :class:`~tuna_lab.placement.plan.Plan` to
``$TUNA_LAB_STATE/plan.json`` and names it in ``TUNA_LAB_PLAN``; the master
reads only W from it (plain JSON: nothing here loads XGBoost or OpenMP
before the fork). The hooks are :mod:`tuna_lab.integrations.gunicorn`'s,
the same any user's Gunicorn server gets:

* ``post_fork`` (worker): take the lowest free slot (a lock file held for
  the worker's life, so the replacement of a crashed or recycled worker
  takes its slot and is pinned to the same cores) - and, the lab's own,
  keep scikit-learn (and with it pandas and pyarrow) out of the worker;
* ``post_worker_init`` (worker), the lab's own: warm up, bind the threads,
  write the binding record, mark ready (:func:`~tuna_lab.server.pinning.pin_worker`);
* ``child_exit`` (master): say the slot goes to the replacement, and drop
  the dead worker's binding record;
* ``on_exit`` (master): remove the hooks' state folder.
"""

import os
import sys

from tuna_lab.integrations import gunicorn as _hooks
from tuna_lab.live.runtimes import places_counted
from tuna_lab.server.pinning import drop_record, pin_worker, read_plan

_STATE = os.environ["TUNA_LAB_STATE"]

workers = read_plan(_STATE).workers
# Reads each request whole with a selector before serving it on the main thread (slow or idle sockets hold no
# worker), and tells the app each request's wait (shedding): tuna_lab.server.worker.
worker_class = "tuna_lab.server.worker.LabWorker"
# No control socket (Gunicorn 25.1+ opens ~/.gunicorn/gunicorn.ctl by default, one for all of a user's servers,
# whose `worker add` would change W mid-measurement); older Gunicorns ignore the setting.
control_socket_disable = True
# One request at a time per worker (the article's pre-fork sync model).
threads = 1
# A large model's first request builds the OpenMP pool and caches; be patient.
timeout = int(os.environ.get("TUNA_LAB_TIMEOUT", "120"))
graceful_timeout = 10
max_requests = int(os.environ.get("TUNA_LAB_MAX_REQUESTS", "0"))
loglevel = os.environ.get("TUNA_LAB_LOGLEVEL", "info")
preload_app = False

on_exit = _hooks.on_exit


def post_fork(server, worker):
    # XGBoost imports scikit-learn if it can (for its sklearn-style estimators),
    # and with it scipy's extras, pandas and pyarrow: measured ~125 MB of RSS,
    # ~3 s of start-up and a jemalloc thread per worker, none of which a Booster
    # uses. A None in sys.modules makes that import fail, so XGBoost takes its
    # no-sklearn path. Only here, in the worker: the master, a notebook or a
    # test that builds the app itself keep scikit-learn.
    sys.modules.setdefault("sklearn", None)
    _hooks.post_fork(server, worker)


def post_worker_init(worker):
    slot, plan = _hooks.worker_slot()
    if slot is not None:
        # For `tuna-lab status/pin --pid`: this worker's slot, and whether its main thread sits on one CPU
        # (libgomp counts its OMP_PLACES, which the launcher sets for the policies tuna_lab binds).
        _hooks.record_slot(plan.threads == 1 or places_counted(os.environ))
    pin_worker(worker.wsgi, slot, plan, _STATE)


def child_exit(server, worker):
    _hooks.child_exit(server, worker)
    drop_record(_STATE, workers, worker.pid)
