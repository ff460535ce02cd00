# mcpfleet: every target creates what it needs first, so `make run` and
# `make test` work on a fresh machine.
SHELL := /bin/bash
# Never put the working directory on sys.path: the repo's operator/ folder
# would shadow the standard library's operator module.
export PYTHONSAFEPATH := 1
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CACHE := .cache
BIN := $(CACHE)/bin
STAMP := $(VENV)/.installed

.PHONY: venv deps tools run test test-unit test-fleet test-controlplane lint typecheck bench cluster-up cluster-down clean image node-deps test-node

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the fleet needs (redis-server, prometheus): installed if missing.
deps:
	bash hack/ensure-debs.sh

# Kubernetes tools (helm, etcd, kube-apiserver, ...) built from the pinned Go module.
tools:
	bash hack/tools/build.sh $(BIN)

run: venv deps
	$(VENV)/bin/mcpfleet dev

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/hadolint Dockerfile

# mypy reads the package through a symlink tree shaped like the installed one
# (mcpfleet/server -> server/, mcpfleet/operator -> operator/).
typecheck: venv
	mkdir -p $(CACHE)/typecheck/mcpfleet
	ln -sfn ../../../server $(CACHE)/typecheck/mcpfleet/server
	ln -sfn ../../../operator $(CACHE)/typecheck/mcpfleet/operator
	cd $(CACHE)/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p mcpfleet.server -p mcpfleet.operator

# The node tier (tests/node) needs root, its Debian packages and the image;
# elsewhere its tests skip with the reason (with CI=true they fail).
NODE_PREREQS := $(if $(filter 0,$(shell id -u)),node-deps image)

test: venv deps tools lint typecheck $(NODE_PREREQS)
	$(PY) -m pytest tests

test-unit: venv
	$(PY) -m pytest tests -m unit

test-fleet: venv deps
	$(PY) -m pytest tests -m fleet

test-controlplane: venv deps tools
	$(PY) -m pytest tests -m controlplane

# Speed and memory, measured side by side (router vs direct vs nginx); prints a table.
bench: venv deps
	bash hack/ensure-debs.sh nginx
	PYTHONPATH=tests $(PY) -m fleetkit.bench $(BENCH_ARGS)

# The image: docker build where a Docker engine answers, else buildah on a
# Debian base made here (hack/image/). Last line: localhost/mcpfleet:<tag>.
image:
	bash hack/image/build.sh

node-deps:
	bash hack/ensure-debs.sh image node

test-node: venv deps tools node-deps image
	$(PY) -m pytest tests -m node

# NODE=1: a real node too (containerd, kubelet, scheduler, kube-proxy), pods on a bridge.
cluster-up: venv tools $(if $(NODE),node-deps image)
	PYTHONPATH=tests $(PY) -m fleetkit.cluster up $(if $(NODE),--node)

cluster-down: venv
	PYTHONPATH=tests $(PY) -m fleetkit.cluster down


clean:
	rm -rf $(VENV) build dist *.egg-info
