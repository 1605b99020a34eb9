"""What Gunicorn imports: the WSGI app (``tuna_lab.server.wsgi:app``).

Creating the app is cheap and loads no XGBoost: GNU libgomp's thread pool
does not survive fork, and the master creates the app before forking.

The lab server's worker class, which reads each request whole without
holding a worker and serves it on the worker's main thread, is
:class:`tuna_lab.server.worker.LabWorker` (``worker_class`` in
:mod:`tuna_lab.server.gunicorn_conf`); it is also importable from here.
"""

from .app import app_from_env
from .worker import LabWorker, ReadTimeout, waited

__all__ = ["app", "LabWorker", "ReadTimeout", "waited"]

app = app_from_env()
