#!/usr/bin/env bash
# One call on a lent GPU machine (docs/gpu.md): its environment, the GPU tests (each outcome a
# line as it ends, so a run stopped by its limit keeps them), then the GPU benchmark; everything
# is written under $OUT. libcst travels as a wheel in .whl/ (the machine has no package index);
# the rest (torch with CUDA, pytest, xdist, rich, matplotlib) is there.
#   run: bash benchmarks/gpu_session.sh   (carry .whl)
set -u
OUT=${OUT:-/tmp/dp2ddp-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), torch.cuda.get_device_name())"
  python3 -m pip list 2>/dev/null | grep -i -E "^(torch|libcst|pytest|pytest-xdist|rich|matplotlib|click|jinja2|numpy) "
  nproc
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
DP2DDP_GPU_REPORT="$OUT/gpu-tests.jsonl" timeout "${TESTS_S:-330}" python3 -m pytest -p no:cacheprovider -n "${WORKERS:-14}" \
  -m gpu tests/gpu ${PYTEST_K:+-k "$PYTEST_K"} -rs -v --junitxml="$OUT/gpu-tests.xml" > "$OUT/tests.log" 2>&1
echo "tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.log" | tail -25
timeout "${BENCH_S:-200}" python3 benchmarks/bench_gpu.py --json "$OUT/gpu-bench.json" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
echo "bench exit $?"; tail -8 "$OUT/bench.log"
