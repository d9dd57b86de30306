# make demo: install into .venv, run a gym and a JAX rollout into ./demo-store (a new pair of runs each time,
#            named by the time), print the statistics of every run, then serve the store: the dashboard's URL is
#            printed last (Ctrl-C stops the server; `make clean` removes the store).
# make test: install into .venv (with every integration, [all], and the test tools, [dev]) and the virtualenv of
#            the declared minimum versions (min-venv), and run the whole test suite.
# make min-venv: a virtualenv in .cache/min-venv with every core dependency at the minimum pyproject.toml
#            declares (gymnasium 1.0.0, the version d3rlpy pins, among them) and trajstore itself (editable);
#            tests/integrations/test_min_versions.py rolls out, records and reads there (~30 s to build, once).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STORE ?= ./demo-store
PORT ?= 8321
RUN := $(shell date +%Y%m%d-%H%M%S)
MIN_VENV ?= .cache/min-venv

.PHONY: install demo test bench system-tools min-venv clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# PyTorch's CPU build first (pinned: an open range alone would pull the newest CUDA build, several GB)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all,dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/trajstore rollout --backend gym --env CartPole-v1 --num-envs 8 --episodes 500 --store $(STORE) --run demo-gym-$(RUN) --seed 0
	$(VENV)/bin/trajstore rollout --backend jax --env cartpole --num-envs 1024 --steps 500000 --store $(STORE) --run demo-jax-$(RUN) --seed 0
	$(VENV)/bin/trajstore stats --store $(STORE) --by run_id --gamma 0.99
	@echo "dashboard: http://127.0.0.1:$(PORT)/dashboard  (serving $(STORE); Ctrl-C stops it)"
	$(VENV)/bin/trajstore serve --store $(STORE) --port $(PORT)

test: install system-tools min-venv
	$(PY) -m pytest

# Each core dependency pinned to its declared minimum ("name>=x" in [project] dependencies becomes "name==x").
$(MIN_VENV)/.installed: pyproject.toml
	rm -rf $(MIN_VENV)
	$(PYTHON) -m venv $(MIN_VENV)
	$(PYTHON) -c 'import re; text = open("pyproject.toml").read(); \
	  deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1); \
	  print("\n".join(d.replace(">=", "==") for d in re.findall(r"\"([^\"]+)\"", deps)))' > $(MIN_VENV)/minimums.txt
	$(MIN_VENV)/bin/python -m pip install -q -c $(MIN_VENV)/minimums.txt -e .
	touch $@

min-venv: $(MIN_VENV)/.installed

# From Debian's packages: chromium for the dashboard's browser tests (Playwright drives it; its own browser
# download is not used), and docker-compose to validate docker-compose.yml (no Docker engine is needed).
system-tools:
	@{ command -v chromium >/dev/null 2>&1 && command -v docker-compose >/dev/null 2>&1; } || \
	  { apt-get update -qq && apt-get install -y -qq chromium docker-compose >/dev/null; } \
	  || echo "could not install chromium/docker-compose (needs root and Debian's apt): their tests will be skipped"

bench: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) $(STORE) $(MIN_VENV)
