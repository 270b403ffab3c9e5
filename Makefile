# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Each creates .venv when it is missing, then installs what it needs into it:
#   make demo  -> the simulator and matplotlib only (`.[plot]`: no torch, no Ray), so a first run is quick;
#   make test  -> everything (`.[dev,rllib,plot,torchrl]` and the example plug-in), torch 2.13.0 first: its CPU
#                 build is on this machine's disk, while an unpinned torch would pull a multi-GB CUDA build.
# One stamp file per install level: a .venv made by `make demo` gets the full install on `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.conduit-demo
FULL_STAMP := $(VENV)/.conduit-full
TORCH := torch==2.13.0

.PHONY: venv venv-demo test test-e2e demo lint bench study-convergence soak clean

venv: $(FULL_STAMP)

venv-demo: $(DEMO_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEMO_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --no-compile -e '.[plot]'
	@touch $(DEMO_STAMP)

$(FULL_STAMP): pyproject.toml examples/conduit-policy-example/pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev,rllib,plot,torchrl]'
	$(PY) -m pip install -q -e examples/conduit-policy-example
	@touch $(FULL_STAMP)

test: $(FULL_STAMP)
	$(PY) -m pytest -q

test-e2e: $(FULL_STAMP)
	$(PY) -m pytest -q -m e2e

demo: $(DEMO_STAMP)
	$(PY) studies/quickstart.py

bench: $(FULL_STAMP)
	$(PY) benchmarks/flow_solver.py
	$(PY) benchmarks/sim_ppo_x128.py
	$(PY) benchmarks/audit_throughput.py
	$(PY) benchmarks/audit_memory.py
	$(PY) benchmarks/runtime_throughput.py
	$(PY) benchmarks/runtime_small_chunks.py
	$(PY) benchmarks/runtime_cross_process.py
	$(PY) studies/rllib_experience_path.py --sides stock,conduit

study-convergence: $(FULL_STAMP)
	$(PY) studies/rllib_convergence.py

# DQN on CartPole through the plane for SOAK_MINUTES (30); memory CSV, plot and summary in results/soak
SOAK_MINUTES ?= 30
soak: $(FULL_STAMP)
	$(PY) benchmarks/soak_dqn.py --minutes $(SOAK_MINUTES) --out results/soak

lint: $(FULL_STAMP)
	$(VENV)/bin/ruff check conduit tests studies benchmarks examples

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
