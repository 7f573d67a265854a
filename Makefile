# The two Quick start commands: `make serve` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The oldest grpcio and protobuf the client supports (pyproject's lower bounds), with the grpcio-tools that
# generates grpcgrade/v1: `make proto` uses it, and the tests import the client in it.
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed
OLDEST_PINS := grpcio-tools==1.62.3 grpcio==1.62.3 protobuf==4.21.6

.PHONY: serve test proto lint bench clean

$(STAMP): pyproject.toml plugins/*/pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[server,test]' $(foreach p,$(wildcard plugins/*/),-e $(p))
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/grpcgrade serve --port 50051 --metrics-port 9090

test: $(STAMP)
	$(BIN)/python -m pytest -q

$(OLDEST_STAMP): Makefile
	test -d $(OLDEST) || $(PY) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install --quiet $(OLDEST_PINS)
	touch $(OLDEST_STAMP)

proto: $(OLDEST_STAMP)
	$(OLDEST)/bin/python -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. proto/grpcgrade/v1/grading.proto

lint: $(STAMP)
	$(BIN)/ruff check grpcgrade tests plugins scripts
	$(BIN)/ruff format --check grpcgrade tests plugins scripts

bench: $(STAMP)
	$(BIN)/grpcgrade bench

clean:
	rm -rf $(VENV) $(OLDEST) build *.egg-info
