"""The one thing pyproject.toml cannot say: the load generator's C loop (issue 50).

``optional=True``: where no C compiler or Python headers are found, the install still succeeds and
:func:`tuna_lab.measure.loadgen.wire.drive` runs its Python loop, saying why in every trial's
``attrs["generator"]`` (see docs/load-bench.md).
"""

from setuptools import Extension, setup

_DIR = "tuna_lab/measure/loadgen/"

setup(ext_modules=[Extension("tuna_lab.measure.loadgen._engine",
                             [_DIR + name for name in ("_engine.c", "_engine_conn.c", "_engine_http.c")],
                             depends=[_DIR + "_engine.h"],
                             # hidden: the files' shared functions (fail, readable ...) stay inside the module
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-fvisibility=hidden"],
                             optional=True)])
