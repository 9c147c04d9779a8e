# seedbed: `make run` trains the default agent, `make test` runs the whole suite.
# Both create .venv and install everything from this project's own files first.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test test-football football lint format docs docs-check bench proto clean

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "seedbed needs Python 3.10+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/seedbed train $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-football: $(STAMP)
	$(BIN)/python -m pytest tests/test_football.py $(PYTEST_ARGS)

# Google Research Football (--env football:SCENARIO), optional and never part of `dev`: gfootball
# 2.10.2 has no wheels, so this builds its C++ engine from source (Debian/Ubuntu, as root or with
# SUDO=sudo). Its build script runs `python3 -c 'import psutil'`, so the venv goes first on PATH and
# build isolation is off; --no-deps keeps its opencv-python away from opencv-python-headless.
FOOTBALL_APT := git cmake build-essential libgl1-mesa-dev libegl1-mesa-dev libsdl2-dev \
	libsdl2-image-dev libsdl2-ttf-dev libsdl2-gfx-dev libboost-filesystem-dev libboost-system-dev \
	libboost-thread-dev libboost-python-dev
football: $(STAMP)
	$(SUDO) apt-get update
	$(SUDO) apt-get install -y --no-install-recommends $(FOOTBALL_APT)
	$(BIN)/python -m pip install --disable-pip-version-check -c constraints.txt -e '.[football]'
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pip install --disable-pip-version-check \
		-c constraints.txt --no-build-isolation --no-deps gfootball
	$(BIN)/python -c 'import gfootball.env, gfootball_engine; print("gfootball OK")'

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples docs
	$(BIN)/ruff format --check src tests bench examples docs

format: $(STAMP)
	$(BIN)/ruff format src tests bench examples docs
	$(BIN)/ruff check --fix src tests bench examples docs

# The documentation site (mkdocs.yml) into site/; --strict: a broken link or reference fails.
# `make test` builds it too (tests/test_docs.py). NO_MKDOCS_2_WARNING: Material's banner.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Every page of site/ in headless Chromium (Debian: apt-get install chromium): no console error,
# no resource that fails to load, no internal link or anchor that does not resolve.
docs-check: docs
	$(BIN)/python docs/check_site.py site

bench: $(STAMP)
	$(BIN)/python bench/throughput.py

# Regenerate the checked-in message code after editing actor.proto (grpcio-tools bundles protoc
# 7.35; it lives in its own venv so the project's stays as pyproject.toml declares it).
proto:
	$(PYTHON) -m venv .venv-proto
	.venv-proto/bin/python -m pip install --quiet grpcio-tools==1.85.1
	cd src/seedbed/transport/proto && ../../../../.venv-proto/bin/python -m grpc_tools.protoc \
		-I. --python_out=. --pyi_out=. actor.proto

clean:
	rm -rf $(VENV) .venv-proto runs site .pytest_cache .ruff_cache src/*.egg-info
