"""The Gunicorn + XGBoost inference server of the article's pattern P.

Submodules are imported on demand (``tuna_lab.server.app``,
``tuna_lab.server.models``, ...): importing this package loads no XGBoost,
so a Gunicorn master can import it before forking.
"""

__all__ = []
