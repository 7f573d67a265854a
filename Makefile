# The two Quick start commands: `make serve` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test proto lint bench clean

$(STAMP): pyproject.toml plugins/*/pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]' $(foreach p,$(wildcard plugins/*/),-e $(p))
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/grpcgrade serve --port 50051 --metrics-port 9090

test: $(STAMP)
	$(BIN)/python -m pytest -q

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. proto/grpcgrade/v1/grading.proto

lint: $(STAMP)
	$(BIN)/ruff check grpcgrade tests plugins scripts
	$(BIN)/ruff format --check grpcgrade tests plugins scripts

bench: $(STAMP)
	$(BIN)/grpcgrade bench

clean:
	rm -rf $(VENV) build *.egg-info
