# The user's own Gunicorn config: three lines bring in tuna_lab's hooks.
import os

os.environ.setdefault("TUNA_LAB_POLICY", "tuna-scatter")
os.environ.setdefault("TUNA_LAB_THREADS", "2")
from tuna_lab.integrations.gunicorn import post_fork, post_worker_init, child_exit, on_exit  # noqa: E402,F401

workers = 2
