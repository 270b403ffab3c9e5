#!/bin/bash
# Gather the pure-Python test dependencies into .devdeps/ (ignored by git) for a GPU machine that has
# PyTorch and CUDA but no package registry and no Ray: SimPy, NetworkX, pytest, Hypothesis (its wheel
# for the GPU machine's Python, default 3.12), with their metadata (entry points: the policy plug-in
# example registers through one). Then run benchmarks/gpu/check.sh there with .devdeps carried along.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER=${PYVER:-3.12}
SP=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf .devdeps && mkdir .devdeps
for p in simpy networkx sortedcontainers pytest _pytest pluggy iniconfig py.py pygments typing_extensions.py yaml tqdm \
         packaging attr attrs; do cp -r "$SP/$p" .devdeps/; done
for d in simpy networkx sortedcontainers pytest pluggy iniconfig pygments typing_extensions tqdm packaging attrs \
         conduit_rl conduit_policy_example; do cp -r "$SP"/${d}-*.dist-info .devdeps/; done
tmp=$(mktemp -d)
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --platform manylinux2014_x86_64 \
    "hypothesis==$(.venv/bin/python -c 'import hypothesis; print(hypothesis.__version__)')" -d "$tmp"
.venv/bin/python -m zipfile -e "$tmp"/hypothesis-*.whl "$tmp/x"
cp -r "$tmp"/x/hypothesis "$tmp"/x/_hypothesis_* "$tmp"/x/hypothesis-*.dist-info .devdeps/
grep -qs '^/.devdeps/$' .git/info/exclude || { mkdir -p .git/info; echo /.devdeps/ >> .git/info/exclude; }
du -sh .devdeps
