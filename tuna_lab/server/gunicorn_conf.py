"""Gunicorn configuration (``-c python:tuna_lab.server.gunicorn_conf``): workers pinned by slot.

The launcher writes its :class:`~tuna_lab.placement.plan.Plan` to
``$TUNA_LAB_STATE/plan.json``; this module reads it in the master (plain JSON:
nothing here loads XGBoost or OpenMP before the fork) and installs four hooks:

* ``pre_fork`` (master): give the new worker the lowest free slot;
* ``post_fork`` (worker): keep scikit-learn (and with it pandas and pyarrow)
  out of the worker;
* ``post_worker_init`` (worker): warm up, bind the threads, mark ready;
* ``child_exit`` (master): free the slot and drop its record, so the
  replacement of a crashed or recycled worker is pinned to the same cores.
"""

import os
import sys

from tuna_lab.server.pinning import pick_slot, pin_worker, read_plan, record_path

_STATE = os.environ["TUNA_LAB_STATE"]
_PLAN = read_plan(_STATE)

workers = _PLAN.workers
# Gunicorn's sync worker with a read deadline per connection, telling the app each request's wait (shedding).
worker_class = "tuna_lab.server.wsgi.LabWorker"
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


def pre_fork(server, worker):
    live = [getattr(w, "tuna_slot", None) for w in server.WORKERS.values()]
    worker.tuna_slot = pick_slot(live, _PLAN.workers, worker.age)


def post_fork(server, worker):
    # XGBoost imports scikit-learn if it can (for its sklearn-style estimators),
    # and with it scipy's extras, pandas and pyarrow: measured ~125 MB of RSS,
    # ~3 s of start-up and a jemalloc thread per worker, none of which a Booster
    # uses. A None in sys.modules makes that import fail, so XGBoost takes its
    # no-sklearn path. Only here, in the worker: the master, a notebook or a
    # test that builds the app itself keep scikit-learn.
    sys.modules.setdefault("sklearn", None)


def post_worker_init(worker):
    pin_worker(worker.wsgi, worker.tuna_slot, _PLAN, _STATE)


def child_exit(server, worker):
    slot = getattr(worker, "tuna_slot", None)
    if slot is None:
        return
    path = record_path(_STATE, slot)
    from .._files import read_json

    try:
        record = read_json(path, limit=1 << 16, follow=False)
        if isinstance(record, dict) and record.get("pid") == worker.pid:
            os.remove(path)
    except OSError:
        pass
