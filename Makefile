# dynnet_ros — developer entry points. `make demo` and `make test` work on a fresh
# Debian/Ubuntu machine with Python >= 3.11 and no ROS installed: they build .venv from
# PyPI (ROS 2 Kilted wheels included) and install this package editable.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DEMO_DURATION ?= 30
PYTEST_ARGS ?=

# Keep every ROS process on loopback unless the user chose otherwise.
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export RMW_IMPLEMENTATION ?= rmw_fastrtps_cpp
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: venv zoo test lint demo bench colcon-check clean help

help:
	@echo "make demo   - build the venv and demo models, run the vehicle graph, write demo-report/"
	@echo "make test   - build the venv and run the whole test suite"
	@echo "make lint   - ruff and mypy (also part of make test)"
	@echo "make bench  - run the benchmarks under bench/"

$(VENV)/.stamp: requirements.txt requirements-dev.txt setup.py package.xml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dynnet_ros needs Python >= 3.11 (onnxruntime 1.32 has no wheels for older ones); run: make PYTHON=python3.11 ...")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

venv: $(VENV)/.stamp

# ROS 2 launch + launch_ros (no PyPI wheels) for test/test_launch.py, from the kit beside the repo
# (CI clones ../shared next to it); without the kit, that test skips and says why.
LAUNCH_KIT ?= ../shared/vendor/ros2-launch
ifneq ($(wildcard $(LAUNCH_KIT)/install.sh),)
LAUNCH_STAMP := $(VENV)/.launch-kit
$(LAUNCH_STAMP): $(VENV)/.stamp requirements-launch.txt $(LAUNCH_KIT)/install.sh
	$(PY) -m pip install --quiet -r requirements-launch.txt
	bash $(LAUNCH_KIT)/install.sh $(VENV)
	touch $@
endif

zoo: venv
	$(VENV)/bin/dynnet zoo build

test: venv $(LAUNCH_STAMP)
	$(PY) -m pytest test $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check dynnet_ros test bench launch setup.py
	$(VENV)/bin/mypy dynnet_ros

demo: zoo
	$(VENV)/bin/dynnet demo --duration $(DEMO_DURATION) --report demo-report

bench: zoo
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build install log demo-report .pytest_cache *.egg-info
