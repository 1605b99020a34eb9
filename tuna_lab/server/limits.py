"""The lab server's bounds on what one request may cost, apart from the app so that reading them is cheap.

``tuna-lab serve``'s options print these defaults in their help; the CLI
reads them from here without importing the app (numpy, XGBoost).

Examples
--------
>>> READ_TIMEOUT
5.0
"""

__all__ = ["MAX_BODY_BYTES", "ROW_BUDGET_BYTES", "MAX_WORK", "READ_TIMEOUT", "RETRY_AFTER"]

#: Largest request body the server reads by default (``TUNA_LAB_MAX_BODY``); larger ones get 413.
MAX_BODY_BYTES = 50 * 1024 * 1024
#: Memory the rows of one request may take as float64 input, which sets the default row limit
#: (:func:`tuna_lab.server.app.max_rows`): a few huge requests must not push a worker into swap or the OOM killer.
ROW_BUDGET_BYTES = 50 * 1024 * 1024
#: Work one request may ask for by default (``TUNA_LAB_MAX_WORK``, ``tuna-lab serve --max-work``): its
#: rows x the model's cost (:func:`~tuna_lab.server.models.model_cost`). About 3 s of one CPU here
#: (65,104 rows of small, 22,321 of medium; large's 8,359 rows are bounded by memory first): a
#: 220,000-row request of small held a worker 14 s, most of it in SHAP, before this bound.
MAX_WORK = 250_000_000
#: Seconds a connection has, from the moment the server accepts it, to send its whole request (headers
#: and body), while it holds no worker; each response write has as long. Loopback clients send a 50 MB
#: body in well under it.
READ_TIMEOUT = 5.0
#: Seconds a client shed with 503 is told to wait (``Retry-After``) before it tries again.
RETRY_AFTER = 1
