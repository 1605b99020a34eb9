"""Collection settings for ``pytest --doctest-modules tuna_lab/...`` (the tests have tests/conftest.py)."""

# Gunicorn's config reads the launcher's plan when imported: only a server started by the launcher may import it.
collect_ignore = ["tuna_lab/server/gunicorn_conf.py"]
