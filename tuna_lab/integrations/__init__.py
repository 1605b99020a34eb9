"""Apply tuna_lab to servers it did not start.

:mod:`tuna_lab.integrations.gunicorn` holds the hooks for a user's own
``gunicorn.conf.py``; ``tuna-lab pin --pid`` (:mod:`tuna_lab.live.pin`)
pins any running pre-fork server.
"""

__all__ = []
