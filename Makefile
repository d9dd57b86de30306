# make demo: install what the demo runs into .venv (trajstore with its service, gymnasium and JAX: the extras
#            DEMO_EXTRAS, not every integration; nothing more where `make install` made .venv), run a gym and a JAX
#            rollout into ./demo-store (a new pair of runs each time, named by the time), print the statistics of
#            every run, then serve the store: how to put `trajstore` on PATH (source .venv/bin/activate) and the
#            dashboard's URL are printed last (Ctrl-C stops the server, and make with it, without an error;
#            `make clean` removes the store). DEMO_INSTALL= skips the install (an environment that has it all).
# make test: install into .venv (with every integration, [all], and the test tools, [dev]) and the virtualenv of
#            the declared minimum versions (min-venv), and run the whole test suite (building .venv-lerobot
#            first when a Python >= 3.12 is here; its tests skip without it), on three workers (pytest-xdist, each
#            test module on one worker, so that its module fixtures are made once; TEST_WORKERS=N for another count).
# make check: the fast tier, for the edit-test loop: every test not marked as needing a server,
#            a browser, S3, Spark, LeRobot, Ray, a long run or the security probe (tests/tiers.py says what each
#            marker means), on two workers (CHECK_WORKERS); needs only `make install`.
# make timings: run the whole suite as make test does and write each test's seconds to tests/timings.json: a test
#            that took more than 0.5 s is left out of make check (tests/tiers.py), and the workers take the longest
#            files first. Run it again when tests were added or made faster.
# make docs: the documentation site (guides and the API reference) into build/site, warnings as errors.
# make lint: ruff over the whole tree with the rules pyproject.toml chooses, then make typecheck (.ci/run runs it
#            before the tests).
# make typecheck: mypy over trajstore/ and api/ as pyproject.toml's [tool.mypy] configures it (zero errors).
# make min-venv: a virtualenv in .cache/min-venv with every core dependency and the gym extra's at the minimum
#            pyproject.toml declares (gymnasium 1.0.0, the version d3rlpy pins, among them) and trajstore itself
#            (editable); tests/integrations/test_min_versions.py rolls out, records and reads there (~30 s to build,
#            once).
# make core-venv: a virtualenv in .cache/core-venv with trajstore (editable) and its core dependencies alone, no
#            extra; tests/test_core_install.py stores, reads and runs the CLI there, and checks that each feature of
#            an extra names the extra to install (~1 min to build, once; the test builds it when it is missing).
# make lerobot-venv: a separate venv, .venv-lerobot, with the real lerobot release (it needs Python >= 3.12 and its
#            own torch) that tests/export/test_lerobot.py opens the exported datasets with; built once, then kept.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STORE ?= ./demo-store
PORT ?= 8321
RUN := $(shell date +%Y%m%d-%H%M%S)
MIN_VENV ?= .cache/min-venv
CORE_VENV ?= .cache/core-venv
# what the demo runs: the service, gymnasium rollouts, JAX rollouts
DEMO_EXTRAS ?= serve,gym,jax
DEMO_INSTALL ?= demo-install

LEROBOT_VENV ?= .venv-lerobot
LEROBOT_SPEC ?= lerobot[dataset]==0.6.1
# Python >= 3.12 for it: LEROBOT_PYTHON if given, else the first that runs of python3.12, python3.13 and pyenv's
# (pyenv's shims on PATH fail for a version that is not selected, so its versions are tried directly)
LEROBOT_PYTHONS = $(LEROBOT_PYTHON) python3.12 python3.13 $(wildcard $(HOME)/.pyenv/versions/3.1[23]*/bin/python3)

# the tiers `make check` leaves out (pyproject.toml declares each marker)
CHECK_SKIPS := server or browser or s3 or spark or lerobot or ray or slow or security

# Python writes the bytecode of what it imports (and pytest its rewritten test modules) into __pycache__: each of the
# suite's processes (the workers, every CLI, `trajstore serve` and SQL worker a test starts) would otherwise compile
# trajstore again, ~0.25 s each, and collecting the suite would take 19 s instead of 12 (PYTHONDONTWRITEBYTECODE is
# set in some images).
unexport PYTHONDONTWRITEBYTECODE

# each test file on one worker (its module fixtures made once), the files handed out in the order tests/tiers.py gives
# them (the longest first, by tests/timings.json). The whole suite on three workers: its slow files wait on servers,
# timeouts and kills, and a third worker computes meanwhile (on two cores, with one thread per worker as tests/tiers.py
# sets: 19:13 against 21:19 on two). The fast tier computes all along: two workers (142 s; three took 146 s).
XDIST := --dist loadfile --no-loadscope-reorder
TEST_WORKERS ?= 3
CHECK_WORKERS ?= 2

.PHONY: install demo demo-install test check timings lint docs typecheck bench bench-torchrl-venv system-tools min-venv core-venv lerobot-venv vendor-plotly clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# PyTorch's CPU build first (pinned: an open range alone would pull the newest CUDA build, several GB)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all,dev]'
	touch $@

install: $(VENV)/.installed

$(VENV)/.installed-demo: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(DEMO_EXTRAS)]'
	touch $@

# nothing to do where this or `make install` (every extra) is up to date
demo-install:
	@for done in $(VENV)/.installed-demo $(VENV)/.installed; do \
	  [ -f $$done ] && [ ! pyproject.toml -nt $$done ] && exit 0; done; \
	$(MAKE) --no-print-directory $(VENV)/.installed-demo

# its last step serves until Ctrl-C, which `trajstore serve` answers with exit status 0 (make stops quietly)
demo: $(DEMO_INSTALL)
	$(VENV)/bin/trajstore rollout --backend gym --env CartPole-v1 --num-envs 8 --episodes 500 --store $(STORE) --run demo-gym-$(RUN) --seed 0
	$(VENV)/bin/trajstore rollout --backend jax --env cartpole --num-envs 1024 --steps 500000 --store $(STORE) --run demo-jax-$(RUN) --seed 0
	$(VENV)/bin/trajstore stats --store $(STORE) --by run_id --gamma 0.99
	@echo "the trajstore command is $(VENV)/bin/trajstore: put it on your PATH with  source $(VENV)/bin/activate"
	@echo "dashboard: http://127.0.0.1:$(PORT)/dashboard  (serving $(STORE); Ctrl-C stops it)"
	$(VENV)/bin/trajstore serve --store $(STORE) --port $(PORT)

test: install system-tools min-venv core-venv
	@$(MAKE) --no-print-directory lerobot-venv || echo "could not build $(LEROBOT_VENV): the LeRobot tests will be skipped"
	$(PY) -m pytest -n $(TEST_WORKERS) $(XDIST)

check: install
	$(PY) -m pytest -n $(CHECK_WORKERS) $(XDIST) -m "not ($(CHECK_SKIPS))"

timings: install system-tools min-venv core-venv
	@$(MAKE) --no-print-directory lerobot-venv || echo "could not build $(LEROBOT_VENV): the LeRobot tests will be skipped"
	$(PY) -m pytest -n $(TEST_WORKERS) $(XDIST) --record-timings tests/timings.json

lint: install
	$(VENV)/bin/ruff check .
	@$(MAKE) --no-print-directory typecheck

.PHONY: typecheck
typecheck: install
	$(VENV)/bin/mypy

# The documentation site into build/site (MkDocs, mkdocs.yml): warnings are errors, nothing fetched from the network.
docs: install
	$(VENV)/bin/mkdocs build --strict

# Each core dependency and the gym extra's pinned to its declared minimum ("name>=x" becomes "name==x").
$(MIN_VENV)/.installed: pyproject.toml
	rm -rf $(MIN_VENV)
	$(PYTHON) -m venv $(MIN_VENV)
	$(PYTHON) -c 'import tomllib; project = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  deps = project["dependencies"] + project["optional-dependencies"]["gym"]; \
	  print("\n".join(d.replace(">=", "==") for d in deps))' > $(MIN_VENV)/minimums.txt
	$(MIN_VENV)/bin/python -m pip install -q -c $(MIN_VENV)/minimums.txt -e '.[gym]'
	touch $@

min-venv: $(MIN_VENV)/.installed

# `pip install trajstore` and nothing else (tests/test_core_install.py builds the same when it is missing)
$(CORE_VENV)/.installed: pyproject.toml
	rm -rf $(CORE_VENV)
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/python -m pip install -q -e .
	touch $@

core-venv: $(CORE_VENV)/.installed

# lerobot pins torch < 2.12 and PyPI has no CPU-only build of it for Linux: pip brings the CUDA one (~4 GB of
# wheels, unused here). A failed build leaves no half venv behind.
$(LEROBOT_VENV)/.installed:
	@for py in $(LEROBOT_PYTHONS) none; do \
	  $$py -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && break; done; \
	test "$$py" != none || { echo "no Python >= 3.12 found (give one: make lerobot-venv LEROBOT_PYTHON=...)"; exit 1; }; \
	echo "building $(LEROBOT_VENV) with $$py: $(LEROBOT_SPEC)"; \
	rm -rf $(LEROBOT_VENV) && $$py -m venv $(LEROBOT_VENV) && \
	$(LEROBOT_VENV)/bin/python -m pip install -q '$(LEROBOT_SPEC)' || { rm -rf $(LEROBOT_VENV); exit 1; }
	touch $@

lerobot-venv: $(LEROBOT_VENV)/.installed

# From Debian's packages: chromium for the dashboard's browser tests (Playwright drives it; its own browser
# download is not used), docker-compose to validate docker-compose.yml (no Docker engine is needed), and a Java
# runtime for the Spark SQL test (pyspark starts a local Spark in it).
system-tools:
	@{ command -v chromium >/dev/null 2>&1 && command -v docker-compose >/dev/null 2>&1 && command -v java >/dev/null 2>&1; } || \
	  { apt-get update -qq && apt-get install -y -qq chromium docker-compose default-jre-headless >/dev/null; } \
	  || echo "could not install chromium/docker-compose/java (needs root and Debian's apt): their tests will be skipped"

# The dashboard's Plotly.js: npm's plotly.js-basic-dist-min (scatter and bar traces), vendored in api/dashboard/vendor/.
# Run it (npm needed) to move to another version; the service serves the file as it is, gzipped.
PLOTLY_VERSION ?= 4.1.1
vendor-plotly:
	rm -rf .plotly-pack && mkdir .plotly-pack
	cd .plotly-pack && npm pack --silent plotly.js-basic-dist-min@$(PLOTLY_VERSION) >/dev/null && tar xzf *.tgz
	cp .plotly-pack/package/plotly-basic.min.js api/dashboard/vendor/plotly-basic.min.js
	cp .plotly-pack/package/LICENSE api/dashboard/vendor/plotly-LICENSE
	rm -rf .plotly-pack

bench: install bench-torchrl-venv
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/run.py

# TorchRL 0.14.1's C++ sum tree (its _torchrl extension) loads only beside the torch it was built with (2.14), not
# the CPU 2.13 of $(VENV): benchmarks/bench_replay.py runs its PrioritizedSampler in this venv of its own (PyPI's
# torch 2.14.1 is a CUDA build, ~5.5 GB, which runs on the CPU; download.pytorch.org's CPU index is not a registry
# CI reaches)
bench-torchrl-venv: .venv-torchrl/.installed
.venv-torchrl/.installed:
	$(PYTHON) -m venv .venv-torchrl
	.venv-torchrl/bin/python -m pip install -q torch==2.14.1 torchrl==0.14.1 tensordict==0.14.3 numpy
	touch $@

clean:
	rm -rf $(VENV) $(LEROBOT_VENV) $(STORE) $(MIN_VENV) $(CORE_VENV)
