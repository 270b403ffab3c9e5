# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Each creates .venv when it is missing (torch 2.13.0 first: its CPU build is on this machine's
# disk, while an unpinned torch would pull a multi-GB CUDA build), then installs the project.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.conduit-installed
TORCH := torch==2.13.0

.PHONY: venv test test-e2e demo lint bench study-convergence clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev,rllib]'
	$(PY) -m pip install -q -e examples/conduit-policy-example
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-e2e: $(STAMP)
	$(PY) -m pytest -q -m e2e

demo: $(STAMP)
	$(PY) studies/quickstart.py

bench: $(STAMP)
	$(PY) benchmarks/flow_solver.py
	$(PY) benchmarks/sim_ppo_x128.py
	$(PY) benchmarks/audit_throughput.py
	$(PY) benchmarks/audit_memory.py
	$(PY) benchmarks/runtime_throughput.py
	$(PY) benchmarks/runtime_small_chunks.py
	$(PY) benchmarks/runtime_cross_process.py
	$(PY) studies/rllib_experience_path.py --sides stock,conduit

study-convergence: $(STAMP)
	$(PY) studies/rllib_convergence.py

lint: $(STAMP)
	$(VENV)/bin/ruff check conduit tests studies benchmarks examples

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
