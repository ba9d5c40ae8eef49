#!/usr/bin/env bash
# One GPU session of checks, as run on the lent H100/H200 (see the issue notes for figures):
#   bash benchmarks/gpu_session.sh tests|bench|corpus
# Logs go to $OUT (default ./gpu-logs). Wheels the image lacks are expected in .whl/.
set -uo pipefail
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD
fi
export STITCHCUDA_CACHE=${STITCHCUDA_CACHE:-$PWD/.stitchcuda/cache}
export MAX_JOBS=${MAX_JOBS:-16}
case "${1:-tests}" in
  tests)
    python3 -m stitchcuda.cli doctor > "$OUT/doctor.txt" 2>&1; echo "doctor rc=$?"
    timeout 480 python3 -m pytest -m gpu -v -s -rA tests/test_gpu.py > "$OUT/pytest_gpu.txt" 2>&1; echo "pytest rc=$?"
    grep -E "PASS|FAIL|ERROR|speedups|profile|passed|failed" "$OUT/pytest_gpu.txt" | tail -n 40; cat "$OUT/doctor.txt"
    ;;
  bench)
    timeout 120 python3 benchmarks/suite_eager_times.py > "$OUT/suite.txt" 2>&1; echo "suite rc=$?"
    timeout 300 python3 benchmarks/verify_bench.py --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1; echo "bench rc=$?"
    timeout 120 python3 -m stitchcuda.cli verify mlp examples/mlp_cuda.py > "$OUT/verify_example.txt" 2>&1; echo "verify rc=$?"
    cat "$OUT/suite.txt" "$OUT/bench.txt"; tail -n 30 "$OUT/verify_example.txt"
    ;;
  corpus)
    timeout 540 python3 benchmarks/hack_corpus.py --json "$OUT/corpus.json" > "$OUT/corpus.txt" 2>&1; echo "corpus rc=$?"
    tail -n 60 "$OUT/corpus.txt"
    ;;
esac
