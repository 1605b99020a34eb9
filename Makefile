# Every target sets itself up on a fresh machine, in one virtual environment (.venv) that grows
# by layers, each with its own stamp: the library alone for `make demo` (the slim path: no test
# tools, no other runtimes), then the test tools, the other runtimes' test apps and Dask for
# `make test`, Debian's hwloc (lstopo) for the tests that compare our topology readers with
# hwloc's, and Debian's chromium, in which kaleido draws the notebooks' still images.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check
BASE_STAMP := $(VENV)/.installed-base
STAMP  := $(VENV)/.installed

.PHONY: demo test test-e2e test-fast bench faults field setup sysdeps clean notebooks notebooks-refresh lab docs api-docs test-ui binder-check device-wheelhouse

# The notebooks are tests too: nbval runs each in a fresh kernel of this venv and
# compares every output except those of cells tagged nbval-ignore-output.
NBVAL  := $(PY) -m pytest -q --nbval --nbval-current-env notebooks/
# Two pytest-xdist workers, a file (a notebook: its cells in order, in one kernel) to each at a time;
# conftest.py says how the two keep from measuring each other (their own CPU locks, `alone` tests).
XDIST  := -n 2 --dist loadfile
LAB_STAMP := $(VENV)/.installed-lab

# The library and the `tuna-lab` command, nothing else: all that `make demo` needs. setup.py and the C
# files: `pip install -e .` compiles the load generator's C loop in place (again when they change).
$(BASE_STAMP): pyproject.toml setup.py $(wildcard tuna_lab/measure/loadgen/_engine*.[ch])
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $(BASE_STAMP)

# + the test tools (dev), the other runtimes' test apps (runtimes) and Dask (cluster). PyTorch
# only as a CPU build (the torch-cpu extra): where the index has none, the PyTorch tests are
# skipped with that reason rather than a CUDA build of several GB installed.
$(STAMP): $(BASE_STAMP)
	$(PIP) -e '.[dev,runtimes,cluster]'
	@$(PIP) -e '.[torch-cpu]' || \
	  echo "warning: no CPU build of torch on this index; the PyTorch tests will be skipped"
	touch $(STAMP)

setup: $(STAMP)

# lstopo is optional for users but the test suite checks against it; install
# it where we can (root on Debian), and let the tests skip with a reason where not.
sysdeps:
	@command -v lstopo >/dev/null 2>&1 || \
	  { (apt-get update -qq && apt-get install -y -qq hwloc >/dev/null) 2>/dev/null \
	    || echo "warning: could not install Debian's hwloc; tests that need lstopo will be skipped"; }
	@# kaleido draws the notebooks' still images (and tests/test_widgets.py checks them) in a headless chromium
	@test -x /usr/bin/chromium || command -v chromium >/dev/null 2>&1 || \
	  { (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) 2>/dev/null \
	    || echo "warning: could not install Debian's chromium; figures' still images are not drawn"; }

demo: $(BASE_STAMP)
	$(VENV)/bin/tuna-lab demo

# The fast lane: the model, the readers, the CLI's refusals and the analysis, with no server: the tests
# marked `server` are left out, and under TUNA_LAB_FAST_LANE=1 a test that starts one all the same fails
# and says so (conftest.py), so that a new test cannot slow the lane unseen. SLOW_TESTS are files left out
# whole (they measure, plant faults, start clusters or run the notebooks). About 3 minutes on 2 idle cores.
SLOW_TESTS := test_faults test_cluster test_targets test_tune test_runtimes test_server test_server_limits \
              test_pin test_roles test_hooks_root test_experiment test_validity test_load test_load_bench \
              test_client_cpus test_widgets test_hostile test_notebooks test_bounds \
              test_audit test_evidence test_python_option test_runtime_table test_custom_policy \
              test_exports test_field_measure
test-fast: $(STAMP)
	TUNA_LAB_FAST_LANE=1 $(PY) -m pytest -q -x $(XDIST) -m "not server" --durations=10 \
	  $(foreach t,$(SLOW_TESTS),--ignore=tests/$(t).py)

test: $(STAMP) sysdeps
	@# The package is installed editable, so pip compiled none of it; where PYTHONDONTWRITEBYTECODE
	@# is set (as on CI) every server, worker and CLI the tests start would compile it again.
	$(PY) -m compileall -q tuna_lab
	@# Two phases. The tests that measure time or CPU (marked `alone`) run last, one at a time: in the same
	@# xdist run they would hold the other worker idle for as long as they run, and an exclusive lock
	@# waits behind every shared one. Everything else fills both workers first. Left out, to keep this
	@# within 10 minutes on 2 cores: the whole-experiment tests (`make test-e2e`, conftest.E2E_FILES) and
	@# the notebooks (`make notebooks`; `make binder-check` runs them as a Binder user would). CI runs all three.
	@date +"make test: the tests from %T"
	$(PY) -m pytest -q $(XDIST) -m "not alone and not e2e" tests --durations=15
	@date +"make test: the tests that run alone from %T"
	$(PY) -m pytest -q -m "alone and not e2e" tests --durations=10
	@date +"make test: done at %T"

# The whole-experiment tests `make test` leaves out (conftest.py says which and why), in the same two phases.
test-e2e: $(STAMP) sysdeps
	$(PY) -m compileall -q tuna_lab
	$(PY) -m pytest -q $(XDIST) -m "e2e and not alone" tests --durations=15
	$(PY) -m pytest -q -m "e2e and alone" tests --durations=10

# The notebooks alone, as `make test` runs them.
notebooks: $(STAMP)
	$(NBVAL)

# Re-run the notebooks and store their outputs (what nbval compares against); review the diff.
notebooks-refresh: $(STAMP)
	$(PY) notebooks/_build.py

$(LAB_STAMP): $(STAMP)
	$(PIP) -e '.[dev,lab]'
	touch $(LAB_STAMP)

# JupyterLab on the notebooks, on the loopback interface only (LAB_ARGS=--no-browser ...);
# Jupyter refuses to run as root unless told, as it is in containers and on CI machines.
lab: $(LAB_STAMP)
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --ServerApp.root_dir=notebooks \
	    $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

UI_STAMP := $(VENV)/.installed-ui

$(UI_STAMP): $(STAMP)
	$(PIP) -e '.[dev,ui]'
	touch $(UI_STAMP)

# Notebook 03 in Voila, and notebooks 03 and 05 in JupyterLab (on 127.0.0.1, with a token), run and
# clicked in headless chromium (Debian's; Playwright's own browser download is not used; the same
# chromium draws the notebooks' still images through kaleido); screenshots and logs in test-artifacts/ui/.
test-ui: $(UI_STAMP)
	@test -x /usr/bin/chromium || command -v chromium >/dev/null 2>&1 || \
	  { (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) 2>/dev/null \
	    || echo "warning: could not install Debian's chromium; the browser test will be skipped"; }
	$(PY) -m pytest -q tests_ui

# Binder (repo2docker) builds its image from binder/: Debian packages from apt.txt, Python from
# runtime.txt, then `pip install -r binder/requirements.txt` in the repository root (it holds
# `.[lab]`: the project, not editable), then postBuild (the models, trained once). binder-check
# does the same in a fresh venv with a fresh model cache, then runs the notebooks there with nbval,
# as a Binder user would run them; nbval (with pytest) and ipykernel are installed after the
# image's requirements, for the check only - they are not in the image. Not part of `make test` (a fresh install takes minutes); CI
# calls it (.ci/run).
BINDER_VENV   := build/binder-venv
BINDER_CACHE  := $(CURDIR)/build/binder-cache
BINDER_PYTHON ?= $(shell command -v python$(shell sed -n 's/^python-//p' binder/runtime.txt) || echo $(PYTHON))

binder-check:
	$(PYTHON) binder/badge.py --check
	@missing=$$(for p in $$(cat binder/apt.txt); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  test -z "$$missing" || (apt-get update -qq && apt-get install -y -qq $$missing >/dev/null) 2>/dev/null \
	  || echo "warning: could not install binder/apt.txt's packages:" $$missing
	rm -rf $(BINDER_VENV) $(BINDER_CACHE)
	$(BINDER_PYTHON) -m venv $(BINDER_VENV)
	$(BINDER_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r binder/requirements.txt
	PATH=$(CURDIR)/$(BINDER_VENV)/bin:$$PATH TUNA_LAB_CACHE=$(BINDER_CACHE) binder/postBuild
	$(BINDER_VENV)/bin/python -m pip install --quiet --disable-pip-version-check nbval ipykernel
	TUNA_LAB_CACHE=$(BINDER_CACHE) $(BINDER_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	    --nbval --nbval-current-env notebooks/

DOCS_STAMP := $(VENV)/.installed-docs

$(DOCS_STAMP): $(BASE_STAMP)
	$(PIP) -e '.[docs]'
	touch $(DOCS_STAMP)

# The documentation site into docs/_build/html: Jupyter Book (Sphinx + MyST-NB), offline,
# no notebook executed; every warning is an error (all of them reported: --keep-going). DOCS_ARGS=--all rebuilds every page.
docs: $(DOCS_STAMP)
	$(VENV)/bin/jupyter-book build --warningiserror --keep-going $(DOCS_ARGS) docs/

# Rewrite docs/api/*.rst and the API part of docs/_toc.yml from the package (after adding or moving a module).
api-docs: $(STAMP)
	$(PY) docs/_ext/api_pages.py

bench: $(STAMP)
	$(VENV)/bin/tuna-lab bench solver --out bench/out/solver.csv --pairwise-limit 60 --doc docs/solver-bench.md
	$(VENV)/bin/tuna-lab bench load --out bench/out/load.csv --doc docs/load-bench.md
	@# run --pid's sampler against a loaded lab server: its share of the server's CPU, <= 2% (about 40 s; docs/anatomy.md)
	$(VENV)/bin/tuna-lab bench sampler --out bench/out/sampler.csv
	@# tune against an exhaustive search of the same candidates: about 20 minutes on 2 CPUs (docs/tune-bench.md)
	$(VENV)/bin/tuna-lab bench tune --out bench/out/tune.csv --doc docs/tune-bench.md
	$(PY) bench/import_bench.py
	$(VENV)/bin/tuna-lab run -w 2 -t 2 --model medium --batch 100 --policies cfs,round-robin,tuna-scatter \
	    --trials 5 --requests 1000 --out bench/out/experiment
	$(VENV)/bin/tuna-lab report bench/out/experiment -o bench/out/experiment/report.html

# The wheels the article's grid needs on the tool library's 16-CPU `device` machine (bench/device_grid.sh;
# docs/maintainers.md): what its Python 3.12 image lacks, at the versions tested here, about 15 MB (its
# carry limit is 64 MiB with the tracked tree). plotly (the report) and sparsediffpy (cvxpy's
# differentiation) are left out: the sweep imports neither; the report is made here from what comes back.
DEVICE_PY ?= 3.12
DEVICE_WHEELS := cvxpy-base gunicorn highspy qdldl xgboost-cpu
device-wheelhouse: $(BASE_STAMP)
	rm -rf .whl && mkdir -p .whl
	$(PY) -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
	    --python-version $(DEVICE_PY) --implementation cp --platform manylinux_2_28_x86_64 \
	    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
	    $$(for n in $(DEVICE_WHEELS); do $(PY) -m pip show $$n | awk -v n=$$n '/^Version:/ {print n "==" $$2}'; done)
	@du -sh .whl

# The fault test with more seeds: a SIGKILL of the sweep, its Gunicorn master or a worker at a random
# point of a small sweep, then a resume, FAULT_SEEDS times (a third of each kind); about 15 s a seed
# on 2 CPUs. `make test` runs three seeds; a Dask worker killed mid-cell is tests/test_cluster.py's.
FAULT_SEEDS ?= 24
faults: $(STAMP)
	TUNA_LAB_FAULT_SEEDS=$(FAULT_SEEDS) $(PY) -m pytest -q -rA tests/test_faults.py

# The field test (docs/field.md): MLServer (+ its XGBoost runtime) and LitServe from PyPI, each in its own
# venv under .venv-field/ (never .venv), each stamped by its requirements file so a second run installs
# nothing; tuna-lab from .venv finds, pins, measures and unpins their workers, checked against /proc.
# A framework pip cannot install here is written down in .venv-field/NAME.install-failed, and its test
# skipped with that reason. tests/field is not collected by `make test` (pyproject's norecursedirs).
FIELD_VENV := .venv-field
FIELD_APPS := tests/field/apps

$(FIELD_VENV)/%/.installed: $(FIELD_APPS)/requirements-%.txt
	@rm -f $(FIELD_VENV)/$*.install-failed
	test -x $(FIELD_VENV)/$*/bin/python || $(PYTHON) -m venv $(FIELD_VENV)/$*
	@if $(FIELD_VENV)/$*/bin/python -m pip install --quiet --disable-pip-version-check -r $< \
	    2>$(FIELD_VENV)/$*.pip.log; then touch $@; else \
	  grep -E '^ERROR' $(FIELD_VENV)/$*.pip.log | tail -n 1 > $(FIELD_VENV)/$*.install-failed; \
	  test -s $(FIELD_VENV)/$*.install-failed || tail -n 1 $(FIELD_VENV)/$*.pip.log > $(FIELD_VENV)/$*.install-failed; \
	  echo "warning: pip could not install $<; its test is skipped:"; cat $(FIELD_VENV)/$*.install-failed; fi

# Threaded workers (issue 47): FastAPI's sync endpoints under uvicorn, Gunicorn gthread, BentoML's thread pool.
FIELD_THREADED := $(FIELD_VENV)/gthread/.installed $(FIELD_VENV)/fastapi/.installed $(FIELD_VENV)/bentoml/.installed

field: $(STAMP) $(FIELD_VENV)/mlserver/.installed $(FIELD_VENV)/litserve/.installed $(FIELD_THREADED)
	$(PY) -m pytest -q -rs tests/field

clean:
	rm -rf $(VENV) .venv-field build *.egg-info .pytest_cache .hypothesis bench/out docs/_build
