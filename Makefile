# dynnet_ros — developer entry points. `make demo` and `make test` work on a fresh
# Debian/Ubuntu machine with Python 3.10-3.13 and no ROS installed: they build a venv from
# PyPI (ROS 2 Kilted wheels included) and install this package editable.
# `make PYTHON=python3.10 test` uses .venv-3.10 (one venv per interpreter; plain python3 keeps
# .venv); .ci/python.sh finds the interpreter (PATH, else pyenv's installed versions).

PYTHON ?= python3
PYTHON_EXE := $(shell bash .ci/python.sh $(PYTHON))
PYTHON_MM  := $(shell $(PYTHON_EXE) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
# ORT=1.17: requirements-ort1.17.txt's onnxruntime over the default pin, in a venv of its own
ORT    ?=
ORT_PINS := $(if $(ORT),requirements-ort$(ORT).txt)
VENV   ?= $(if $(filter python3,$(PYTHON)),.venv,.venv-$(PYTHON_MM))$(if $(ORT),-ort$(ORT))
PY     := $(VENV)/bin/python
DEMO_DURATION ?= 30
# BAG=path: `make demo` plays that rosbag2 directory / .mcap / .db3 / ROS 1 .bag in a loop instead of the simulator
BAG ?=
PYTEST_ARGS ?=

# Keep every ROS process on loopback unless the user chose otherwise.
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export RMW_IMPLEMENTATION ?= rmw_fastrtps_cpp
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: venv zoo test test-subset check lint demo bench colcon-check clean help

help:
	@echo "make demo   - build the venv and demo models, run the vehicle graph, write demo-report/ (BAG=path: on a bag)"
	@echo "make test   - build the venv and run the whole test suite"
	@echo "make test-subset - the platform subset (tests marked 'subset'), e.g. make PYTHON=python3.10 test-subset"
	@echo "make check  - the fast loop: ruff, mypy and the tests that start no process or ROS graph, in parallel"
	@echo "make lint   - ruff and mypy (make test and make check run it first)"
	@echo "make bench  - run the benchmarks under bench/"

$(VENV)/.stamp: requirements.txt requirements-dev.txt requirements-corpus.txt setup.py package.xml $(ORT_PINS)
	@test -n "$(PYTHON_EXE)" || { echo "no runnable $(PYTHON) (PATH or pyenv); see .ci/python.sh"; exit 1; }
	@$(PYTHON_EXE) -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 13) else "dynnet_ros supports Python 3.10-3.13 (README, Supported platforms); run: make PYTHON=python3.12 ...")'
	test -x $(PY) || $(PYTHON_EXE) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(if $(ORT_PINS),$(PY) -m pip install --quiet -r $(ORT_PINS))
	$(PY) -m pip install --quiet --no-deps -r requirements-corpus.txt
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

# composition_interfaces + vision_msgs (no PyPI wheels) built from the kit beside the repo with PyPI's
# rosidl wheels, for the tests that use the real types (composable-node services, Detection2DArray);
# `make test` sources the install space. Without the kit those tests skip and say why.
IFACE_KIT ?= ../shared/vendor/ros2-interfaces
IFACE_DIR := $(VENV)/ros2-interfaces
ifneq ($(wildcard $(IFACE_KIT)/build.sh),)
IFACE_STAMP := $(VENV)/.interfaces-kit
$(IFACE_STAMP): $(VENV)/.stamp $(IFACE_KIT)/build.sh $(IFACE_KIT)/requirements-build.txt
	bash $(IFACE_KIT)/build.sh $(VENV) $(IFACE_DIR)
	touch $@
endif
# the interface packages' install space on the paths (PYTHONPATH, LD_LIBRARY_PATH, AMENT_PREFIX_PATH)
WITH_IFACES := $(if $(IFACE_STAMP),. $(IFACE_DIR)/install/local_setup.sh &&)

zoo: venv
	$(VENV)/bin/dynnet zoo build

# The whole suite: lint, then the tests that start no process or ROS graph and time nothing on all
# cores (pytest-xdist), then the `graph` and `serial` ones one at a time (they start ROS graphs or
# compare timings, which a neighbour on the same core would skew). Both halves run; either failing fails.
test: lint $(LAUNCH_STAMP) $(IFACE_STAMP)
	@rc=0; \
	$(WITH_IFACES) $(PY) -m pytest test -m "not graph and not serial" -n auto $(PYTEST_ARGS) || rc=1; \
	$(WITH_IFACES) $(PY) -m pytest test -m "graph or serial" $(PYTEST_ARGS) || rc=1; \
	exit $$rc

# What .ci/run repeats on every supported interpreter: package import, engine vs onnxruntime on
# every zoo model at two shapes, an RDP conformance sample, one ROS graph test (marker in conftest).
test-subset: venv
	$(PY) -m pytest test -m subset $(PYTEST_ARGS)

# The fast loop for a maintainer: lint, then every test not marked `graph` (starts processes, a ROS
# graph or a launch service), `serial` (compares timings) or `slow`, on all cores (pytest-xdist).
# `make test` stays the whole suite.
check: lint
	$(PY) -m pytest test -m "not graph and not serial and not slow" -n auto -p no:cacheprovider -q $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check dynnet_ros test bench launch setup.py
	$(VENV)/bin/mypy dynnet_ros

demo: zoo
	$(VENV)/bin/dynnet demo --duration $(DEMO_DURATION) --report demo-report $(if $(BAG),--bag "$(BAG)")

bench: zoo
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build install log demo-report .pytest_cache *.egg-info
