"""The WSGI entry point Gunicorn imports (``tuna_lab.server.wsgi:app``).

Creating the app is cheap and loads no XGBoost: the master imports this
module before forking, and GNU libgomp's thread pool does not survive fork.
"""

from .app import app_from_env

app = app_from_env()
