#!/bin/bash
# The CUDA paths on a GPU machine: the runtime's and the plane's tests with CUDA present (device
# batches through the pinned ring, pinned vs pageable copies, every capacity test with a real pinned
# tier beside it; the Ray tests skip where Ray is not installed), then `conduit calibrate --quick` there.
# Dependencies: benchmarks/gpu/prepare_deps.sh (carry .devdeps). Results go to $OUT (default ./gpu-out).
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
PY=$(command -v python || command -v python3)
nvidia-smi -L
$PY -c "import sys,torch;print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
export PYTHONPATH=$PWD:$PWD/examples/conduit-policy-example:$PWD/.devdeps RAY_AUTH_MODE=disabled
timeout 400 $PY -m pytest -p no:cacheprovider -q -rs tests/test_runtime_*.py tests/test_plane_*.py tests/test_recovery.py \
    tests/test_metrics_export.py tests/test_policies.py tests/test_cli_conventions.py > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/pytest.txt" | tail -30
timeout 60 $PY -m conduit calibrate --quick --no-ray --no-disk --out "$OUT/calibrated.yaml" > "$OUT/calibrate.out" 2>&1
echo "calibrate rc=$?"
