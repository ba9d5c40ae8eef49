#!/usr/bin/env bash
# GPU sessions of checks, as run on the lent H100/H200 (the issue notes carry the figures):
#   bash benchmarks/gpu_session.sh MODE...     MODE: tests | bench | ncu | agents | corpus | suite | throughput | reward | grpo
#                                              | zoo | dnn | probe | dnndebug
# zoo: the whole zoo (written here by benchmarks/zoo.py) through benchmarks/ray_scaling.py: ZOO_MODES
# (local, ray, local-1gpu; comma-separated, default local), ZOO_PRESET (quick), ZOO_RUNS (6 per GPU),
# ZOO_HARNESS (a KernelBench checkout: its second opinion too), ZOO_TIMEOUT_S (540 a mode); a mode
# cut at its limit carries on in the next call on a warm machine; each mode's figures come back as
# mode-MODE.json, and `python benchmarks/ray_scaling.py --table --out DIR` compares them anywhere.
# dnn: cuDNN's graph-API convolution plans against float64, timed beside the legacy algorithms.
# probe: benchmarks/harness_probe.py on PROBE_TASK and PROBE_PROGRAM. dnndebug: the graph-API plans'
# GPU test under gdb where the machine has it, with cuDNN's API log (its last 200 lines kept).
# suite: SUITE_TOLERANCES (strict paper), SUITE_STEPS (3), SUITE_RUNS (tasks per GPU, 8), SUITE_TASKS
# (suite, or names separated by commas), SUITE_PRESET (default: with the torch.compile baseline),
# SUITE_FRESH=1 (a new bench, not a resume of the last one on a warm machine: e.g. the second half
# of the suite in a second call).
# tests: TESTS_FILES (tests/test_gpu.py), TESTS_K (a pytest -k expression, e.g. offline), TESTS_S (seconds, 480).
# Modes run in the order given. CORPUS_ONLY=a,b,... limits the corpus run to those candidates,
# whose builds then start in the background at once, on the CPU, while the GPU does the rest.
# Logs go to $OUT (default ./gpu-logs). Wheels the image lacks are expected in .whl/.
set -uo pipefail
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD
fi
# a package already unpacked and pruned to what it needs, where its wheel is too large to bring
# (Ray's 80 MB: its Java jars and RLlib, Serve, Train and Tune left out); a tar archive keeps the
# executable bits of its binaries (Ray's GCS server), which a wheel unpacked by zipfile loses
for archive in .whl/*.tar.xz; do
  [[ -f $archive ]] || continue
  mkdir -p /tmp/site && tar -xJf "$archive" -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD/src:$PWD
done
export STITCHCUDA_CACHE=${STITCHCUDA_CACHE:-$PWD/.stitchcuda/cache}
export MAX_JOBS=${MAX_JOBS:-16}
ONLY=${CORPUS_ONLY:-}
if [[ -n "$ONLY" ]]; then
  python3 -c "import sys; from stitchcuda.task import load_candidate as load; from stitchcuda.verify import PRESETS, Verifier
Verifier(PRESETS['quick']).prebuild([load(f'tests/hacks/{n}.py') for n in sys.argv[1].split(',')])" "$ONLY" \
    > "$OUT/prebuild.txt" 2>&1 &
fi
for mode in "$@"; do
  case "$mode" in
    tests)
      python3 -m stitchcuda.cli doctor > "$OUT/doctor.txt" 2>&1; echo "doctor rc=$?"
      timeout ${TESTS_S:-480} python3 -m pytest -m gpu -v -s -rA ${TESTS_FILES:-tests/test_gpu.py} ${TESTS_K:+-k "$TESTS_K"} \
        > "$OUT/pytest_gpu.txt" 2>&1; echo "pytest rc=$?"
      grep -E "PASS|FAIL|ERROR|speedups|profile|passed|failed" "$OUT/pytest_gpu.txt" | tail -n 40; cat "$OUT/doctor.txt"
      ;;
    bench)
      timeout 120 python3 benchmarks/suite_eager_times.py > "$OUT/suite.txt" 2>&1; echo "suite rc=$?"
      timeout 300 python3 benchmarks/verify_bench.py --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1; echo "bench rc=$?"
      timeout 120 python3 -m stitchcuda.cli verify mlp examples/mlp_cuda.py > "$OUT/verify_example.txt" 2>&1
      echo "verify rc=$?"; cat "$OUT/suite.txt" "$OUT/bench.txt"; tail -n 30 "$OUT/verify_example.txt"
      ;;
    ncu)
      timeout ${NCU_S:-130} python3 -m stitchcuda.cli verify norm_softmax_gate tests/fixtures/candidates/norm_softmax_gate_honest.py \
        --ncu --preset quick > "$OUT/ncu.txt" 2>&1; echo "ncu verify rc=$?"; tail -n 32 "$OUT/ncu.txt"
      ;;
    agents)
      timeout ${AGENTS_S:-180} python3 benchmarks/agent_loop_gpu.py --workspace /tmp/agent-ws > "$OUT/agents.txt" 2>&1
      echo "agent loop rc=$?"; cp /tmp/agent-ws/runs.sqlite "$OUT/" 2>/dev/null; tail -n 45 "$OUT/agents.txt"
      ;;
    corpus)
      wait  # the background builds
      timeout ${CORPUS_S:-$((585 - SECONDS))} python3 benchmarks/hack_corpus.py ${ONLY:+--only "$ONLY"} --json "$OUT/corpus.json" \
        > "$OUT/corpus.txt" 2>&1; echo "corpus rc=$?"; grep -E "expect|none |partial |total |at their level" "$OUT/corpus.txt" | tail -n 30
      ;;
    suite)
      # the offline Coder over the bundled suite (issues 5 and 6): strict then paper, resumable, so
      # several calls finish it (the workspace survives while the machine stays warm)
      for tol in ${SUITE_TOLERANCES:-strict paper}; do
        ws=.stitchcuda/suite-$tol  # ignored, so it stays on a warm machine between calls
        [[ "${SUITE_FRESH:-0}" == 1 ]] && rm -rf "$ws"
        if [[ -f $ws/runs.sqlite ]]; then resume=(--resume last); else resume=(); fi
        timeout ${SUITE_S:-$((585 - SECONDS))} python3 -m stitchcuda.cli bench "${SUITE_TASKS:-suite}" --tolerance "$tol" --preset "${SUITE_PRESET:-default}" \
          --max-steps ${SUITE_STEPS:-3} --runs-per-gpu ${SUITE_RUNS:-8} --workspace "$ws" "${resume[@]}" > "$OUT/suite_$tol.txt" 2>&1
        echo "suite $tol rc=$?"; tail -n 30 "$OUT/suite_$tol.txt"
        # $OUT returns at most 8 files: the report folder and the run store travel as one archive
        python3 -m stitchcuda.cli report last --workspace "$ws" -o "/tmp/report_$tol" > "/tmp/report_$tol.log" 2>&1
        cp "$ws/runs.sqlite" "/tmp/report_$tol/runs.sqlite"
        tar -czf "$OUT/suite_$tol.tgz" -C /tmp "report_$tol" "report_$tol.log"
      done
      ;;
    reward)
      timeout ${REWARD_S:-400} python3 benchmarks/reward_gpu.py > "$OUT/reward.txt" 2>&1
      echo "reward rc=$?"; tail -n 10 "$OUT/reward.txt"
      ;;
    grpo)
      timeout ${GRPO_S:-500} python3 benchmarks/grpo_gpu.py > "$OUT/grpo.txt" 2>&1
      echo "grpo rc=$?"; tail -n 30 "$OUT/grpo.txt"
      ;;
    zoo)
      [[ -d /tmp/zoo ]] || python3 benchmarks/zoo.py write /tmp/zoo > "$OUT/zoo_write.txt" 2>&1
      zout=.stitchcuda/zoo-scaling  # ignored: a cut mode's workspace stays on a warm machine for the next call
      resume=(); compgen -G "$zout/ws-*/runs.sqlite" > /dev/null && resume=(--resume)
      timeout $(( ${ZOO_TIMEOUT_S:-540} * 3 + 60 )) python3 benchmarks/ray_scaling.py --tasks /tmp/zoo \
        --modes "${ZOO_MODES:-local}" --preset "${ZOO_PRESET:-quick}" --runs-per-gpu ${ZOO_RUNS:-6} \
        --timeout-s ${ZOO_TIMEOUT_S:-540} ${ZOO_HARNESS:+--kernelbench-harness "$ZOO_HARNESS"} --out "$zout" \
        "${resume[@]}" > "$OUT/zoo.txt" 2>&1
      echo "zoo rc=$?"; cp "$zout"/mode-*.json "$OUT/" 2>/dev/null; tail -n 25 "$OUT/zoo.txt"
      ;;
    dnn)
      timeout ${DNN_S:-300} python3 -m pytest -m gpu -s -rA tests/test_dnn_graph.py > "$OUT/dnn.txt" 2>&1
      echo "dnn rc=$?"; grep -E "convolutions:|passed|failed|Error" "$OUT/dnn.txt" | tail -n 12
      ;;
    probe)
      # one program run each way KernelBench's harness differs from our worker (PROBE_TASK, PROBE_PROGRAM)
      timeout ${PROBE_S:-400} python3 benchmarks/harness_probe.py "$PROBE_TASK" "$PROBE_PROGRAM" > "$OUT/probe.txt" 2>&1
      echo "probe rc=$?"; tail -n 8 "$OUT/probe.txt"
      ;;
    dnndebug)
      # the graph-API plans' GPU test under gdb (a native backtrace) with cuDNN's API log
      export CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG="$OUT/cudnn_full.log"
      run=(python3 -m pytest -m gpu -x -s -p no:cacheprovider tests/test_dnn_graph.py)
      if command -v gdb > /dev/null; then run=(gdb -q -batch -ex run -ex bt --args "${run[@]}"); fi
      timeout ${DNN_S:-300} "${run[@]}" > "$OUT/dnndebug.txt" 2>&1; echo "dnndebug rc=$?"
      unset CUDNN_LOGLEVEL_DBG CUDNN_LOGDEST_DBG
      tail -n 200 "$OUT/cudnn_full.log" > "$OUT/cudnn_tail.log" 2>/dev/null; rm -f "$OUT/cudnn_full.log"
      grep -n -A30 "SIGSEGV\|Segmentation\|passed\|failed" "$OUT/dnndebug.txt" | head -n 50
      ;;
    throughput)
      timeout ${THROUGHPUT_S:-500} python3 benchmarks/bench_throughput.py > "$OUT/throughput.txt" 2>&1
      echo "throughput rc=$?"; tail -n 6 "$OUT/throughput.txt"
      ;;
  esac
done
