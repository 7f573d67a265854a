# The two Quick start commands: `make serve` and `make test`. Both create .venv on first use.
# `make serve` installs the server and the bundled plugins only; `make test` (CI's one entry, .ci/run)
# adds the test and lint tools. Serve elsewhere: make serve PORT=50052 METRICS_PORT=9091 CONFIG=my.yaml
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SERVER_STAMP := $(VENV)/.installed-server
STAMP := $(VENV)/.installed
# The oldest grpcio and protobuf the client supports (pyproject's lower bounds), with the grpcio-tools that
# generates grpcgrade/v1: `make proto` uses it, and the tests import the client in it.
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed
OLDEST_PINS := grpcio-tools==1.62.3 grpcio==1.62.3 protobuf==4.21.6
PORT ?= 50051
METRICS_PORT ?= 9090
CONFIG ?=

# The plugins `make serve` and `make test` install. grpcgrade-openjudge is not among them: py-openjudge (~700 MB
# with pandas, scikit-learn, dashscope...) pins math-verify < 0.8, which grpcgrade-math-verify's 0.8.0 excludes, so
# it gets an environment of its own (`make test-openjudge`, which .ci/run runs).
BUNDLED := $(filter-out plugins/grpcgrade-openjudge/,$(wildcard plugins/*/))
OPENJUDGE_VENV := .venv-openjudge

.PHONY: serve test test-trainers test-ray test-openjudge test-native native-face proto lint typecheck proto-check bench perf-peers docs cog clean system-deps image-test

# buf (lint and breaking-change checks of proto/) from the npm registry, pinned, into .tools/.
BUF_VERSION := 1.75.0
TOOLS := .tools
BUF := $(TOOLS)/node_modules/.bin/buf

# `make serve` and `make test` started together (the Quick start's two shells) share .venv: every step that
# creates or installs into it holds one lock (flock, util-linux), so two pips never write it at once.
LOCKED := flock $(VENV).lock

$(SERVER_STAMP): pyproject.toml plugins/*/pyproject.toml
	$(LOCKED) sh -c 'test -d $(VENV) || $(PY) -m venv $(VENV)'
	$(LOCKED) $(BIN)/pip install --quiet --upgrade pip
	$(LOCKED) $(BIN)/pip install --quiet -e '.[server,math]' $(foreach p,$(BUNDLED),-e $(p))
	touch $(SERVER_STAMP)

# The development and docs tools on top (pyproject's dependency groups; pip >= 25.1 reads them).
$(STAMP): $(SERVER_STAMP)
	$(LOCKED) $(BIN)/pip install --quiet --group dev --group docs --group bench
	touch $(STAMP)

serve: $(SERVER_STAMP)
	$(BIN)/grpcgrade serve --port $(PORT) --metrics-port $(METRICS_PORT) $(if $(CONFIG),--config $(CONFIG))

test: $(STAMP)
	@command -v bwrap >/dev/null || echo "bubblewrap (bwrap) is missing: the code sandbox's tests will fail; install it with: make system-deps"
	@command -v h2load >/dev/null || echo "h2load (nghttp2-client) is missing: the per-sample bench's test will fail; install it with: make system-deps"
	$(BIN)/python -m pytest -q

# The trainer frameworks' own packages, for the tests marked `trainers` (`make test-trainers`; .ci/run runs
# them, `make test` does not): each test drives the framework's real code in a subprocess of these venvs
# against a server started from .venv. Two venvs because NeMo Gym pins openai<=2.7.2 and verifiers 0.3.1
# needs openai>=2.9. Sizes and install times: docs/trainers.md.
TRAINERS := .venv-trainers
TRAINERS_STAMP := $(TRAINERS)/.installed
TRAINER_PINS := skyrl-gym==0.4.0 verifiers==0.3.1 colorlog==6.12.0
# AReaL without its dependencies (CUDA torch, 9 GB): its reward wrapper needs only colorlog.
AREAL_PIN := areal==1.0.4
NEMO_GYM := .venv-nemo-gym
NEMO_GYM_STAMP := $(NEMO_GYM)/.installed
# nemo-gym 0.4.0 says Python >= 3.12 but runs on 3.11; its own requirement list (its wheel's METADATA).
NEMO_GYM_PIN := nemo-gym==0.4.0
NEMO_GYM_REQS := 'openai<=2.7.2' 'anthropic<=0.109.2' tqdm pydantic pydantic_core devtools fastapi 'mcp>=1.27,<2' \
	itsdangerous uvicorn uvloop hydra-core omegaconf rich 'mlflow-skinny>=3.14.0' 'mlflow>=3.14.0' 'aiohttp>=3.14.1' \
	yappi 'ray[default]>=2.55.1' psutil datasets orjson 'urllib3>=2.7.0' 'fonttools>=4.60.2' \
	'python-multipart>=0.0.22' wandb 'GitPython>=3.1.50' gprof2dot pydot

$(TRAINERS_STAMP): Makefile pyproject.toml
	flock $(TRAINERS).lock sh -c 'test -d $(TRAINERS) || $(PY) -m venv $(TRAINERS)'
	flock $(TRAINERS).lock $(TRAINERS)/bin/pip install --quiet --upgrade pip
	flock $(TRAINERS).lock $(TRAINERS)/bin/pip install --quiet -e . $(TRAINER_PINS)
	flock $(TRAINERS).lock $(TRAINERS)/bin/pip install --quiet --no-deps $(AREAL_PIN)
	touch $(TRAINERS_STAMP)

$(NEMO_GYM_STAMP): Makefile
	flock $(NEMO_GYM).lock sh -c 'test -d $(NEMO_GYM) || $(PY) -m venv $(NEMO_GYM)'
	flock $(NEMO_GYM).lock $(NEMO_GYM)/bin/pip install --quiet --upgrade pip
	flock $(NEMO_GYM).lock $(NEMO_GYM)/bin/pip install --quiet --no-deps --ignore-requires-python $(NEMO_GYM_PIN)
	flock $(NEMO_GYM).lock $(NEMO_GYM)/bin/pip install --quiet $(NEMO_GYM_REQS)
	touch $(NEMO_GYM_STAMP)

test-trainers: $(STAMP) $(TRAINERS_STAMP) $(NEMO_GYM_STAMP)
	$(BIN)/python -m pytest -q -m trainers

# The bridge plugin in its own environment: the server, the plugin (py-openjudge pulled in by pip), pytest.
$(OPENJUDGE_VENV)/.installed: pyproject.toml plugins/grpcgrade-openjudge/pyproject.toml
	test -d $(OPENJUDGE_VENV) || $(PY) -m venv $(OPENJUDGE_VENV)
	$(OPENJUDGE_VENV)/bin/pip install --quiet --upgrade pip
	$(OPENJUDGE_VENV)/bin/pip install --quiet -e '.[server]' -e plugins/grpcgrade-openjudge 'pytest>=8,<10'
	touch $@

test-openjudge: $(OPENJUDGE_VENV)/.installed
	$(OPENJUDGE_VENV)/bin/python -m pytest -q -p no:cacheprovider -c plugins/grpcgrade-openjudge/pyproject.toml -m openjudge plugins/grpcgrade-openjudge/tests

# The Ray executor's tests (`serve --ray`): the grpcgrade[ray] extra, then a local two-node cluster per test.
RAY_STAMP := $(VENV)/.installed-ray
$(RAY_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[ray]'
	touch $(RAY_STAMP)

test-ray: $(RAY_STAMP)
	$(BIN)/python -m pytest -q -m ray

$(OLDEST_STAMP): Makefile
	test -d $(OLDEST) || $(PY) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install --quiet $(OLDEST_PINS)
	touch $(OLDEST_STAMP)

proto: $(OLDEST_STAMP)
	$(OLDEST)/bin/python -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. proto/grpcgrade/v1/grading.proto proto/grpcgrade/v1/admin.proto

lint: $(STAMP)
	$(BIN)/ruff check grpcgrade tests plugins scripts
	$(BIN)/ruff format --check grpcgrade tests plugins scripts docs README.md

typecheck: $(STAMP)
	$(BIN)/mypy

$(TOOLS)/.buf-$(BUF_VERSION):
	npm install --prefix $(TOOLS) --no-audit --no-fund --loglevel=error @bufbuild/buf@$(BUF_VERSION)
	touch $@

# The Node client of tests/test_node_client.py: a client built from proto/ alone (grpc-js, proto-loader).
NODE_GRPC := @grpc/grpc-js@1.14.7 @grpc/proto-loader@0.8.1
$(TOOLS)/.node-grpc:
	npm install --prefix $(TOOLS) --no-audit --no-fund --loglevel=error $(NODE_GRPC)
	touch $@

proto-check: $(TOOLS)/.buf-$(BUF_VERSION)
	$(BUF) lint
	$(BUF) breaking --against proto/baseline/grpcgrade-v1.json

# The native gRPC face (`grpc.face: native`, native/grpc-face/, docs/operations.md): Go, built offline in GOPATH
# mode against Debian's packaged grpc-go and protobuf-go in /usr/share/gocode (no module proxy is reached),
# without cgo (a static binary, no C compiler needed); its unit tests run first. `make system-deps` installs
# the Go packages.
NATIVE_FACE := build/native/grpcgrade-grpc-face
GO_ENV := GOPATH=/usr/share/gocode GO111MODULE=off GOFLAGS= GOPROXY=off CGO_ENABLED=0
native-face: $(NATIVE_FACE)

$(NATIVE_FACE): $(wildcard native/grpc-face/*.go)
	@command -v go >/dev/null || { echo "go is missing: the native gRPC face needs Go; install it with: make system-deps"; exit 1; }
	cd native/grpc-face && $(GO_ENV) go vet . && $(GO_ENV) go test -count=1 . \
		&& $(GO_ENV) go build -trimpath -o $(CURDIR)/$(NATIVE_FACE) .

# The native face's tests against a real server (marked `native`: `make test` runs without Go).
test-native: $(STAMP) $(NATIVE_FACE)
	$(BIN)/python -m pytest -q -m native

bench: $(STAMP)
	$(BIN)/grpcgrade bench --goals

# The peer comparison (issue 21) with the harness in PEERS (not part of the project; never run by the tests):
# builds .venv-peers on first use, installs this working tree's client into it, writes WORK/report.md.
PEERS ?= ../shared/perf-peers
PEER_VENV ?= .venv-peers
PEER_ARGS ?= --workloads json,chrf,math --sizes 512,8192 --reps 3 --profile-seconds 0
WORK ?= $(shell mktemp -d)
perf-peers: $(SERVER_STAMP)
	bash scripts/perf_peers.sh $(PEERS) $(abspath $(PEER_VENV)) $(WORK) $(PEER_ARGS)

# The manual as a site, strict: a broken link, anchor or nav entry fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Rewrite the generated parts of the manual (tests/test_docs.py fails while they are stale).
cog: $(STAMP)
	$(BIN)/cog -r -I scripts $$(grep -l '\[\[\[cog' README.md docs/*.md)

# What pip cannot install (Debian/Ubuntu, as root): bubblewrap, the code sandbox of plugins/grpcgrade-code;
# libseccomp, its seccomp filter's builder; nghttp2-client's h2load, the load generator of
# `grpcgrade bench --per-sample` (a crowd of callers driven from C, so that the client does not cap the servers).
# golang-*: the native gRPC face's compiler and its libraries (grpc-go 1.33, protobuf-go 1.28), built offline.
system-deps:
	apt-get update && apt-get install -y --no-install-recommends bubblewrap libseccomp2 nghttp2-client \
		golang-go golang-google-grpc-dev golang-google-protobuf-dev

# The image built and run by a real container engine, then the compose stack (docs/deploy.md says what it
# checks). As root on Debian: installs and configures podman from Debian's packages first.
image-test: $(SERVER_STAMP)
	bash scripts/image/engine.sh
	$(BIN)/python scripts/image/check.py
	$(BIN)/python scripts/image/compose.py

clean:
	rm -rf $(VENV) $(VENV).lock $(OLDEST) $(TOOLS) $(PEER_VENV) build *.egg-info
