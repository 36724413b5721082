#!/usr/bin/env bash
# `make gpu-test`: the CUDA half verified in one command, on a machine that already has a CUDA
# build of torch in its python, nvcc and no network (nothing is installed).
#   1. builds the extension in place with FORCE_CUDA=1 for the visible GPU's architecture
#   2. python -m torch_tfgrads check-build --require-cuda (this step, the CUDA tests and the
#      benchmarks run with tools/native_backtrace.c preloaded: a crash prints its native stack)
#   3. every CUDA test (pytest -m needs_cuda) with TFGRADS_REQUIRE_CUDA=1: a missing GPU or
#      missing CUDA kernels fail instead of skipping
#   4. compute-sanitizer memcheck and racecheck over tools/cuda_smoke.py (every CUDA kernel
#      once, with multi-block shapes)
#   5. the four op-family benchmarks with --device cuda --quick (one GPU-sized shape each,
#      sized for about a minute and a half in all; each stopped after BENCH_TIMEOUT seconds,
#      default 60): their tables are the logs bench-<family>.log; a crash or a timeout fails
#      the step, the numbers themselves are not checked
# It writes summary.txt and one log per step into GPU_REPORT_DIR (default build/gpu-report) and
# exits non-zero if any step failed. GPU_TEST_STEPS picks some of the steps (names as above:
# "build check-build cuda-tests memcheck racecheck bench", the default), e.g. to split the kit
# over two calls of a machine lent for minutes; PYTEST_ADDOPTS reaches the CUDA tests
# (e.g. "-n 4 --timeout 300" where pytest-xdist and pytest-timeout are installed).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Nothing is installed there: the in-place build is imported from the checkout, also by the
# scripts under tools/ and benchmarks/ (whose own folder, not the root, heads sys.path).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
REPORT=${GPU_REPORT_DIR:-build/gpu-report}
mkdir -p "$REPORT"
SUMMARY="$REPORT/summary.txt"
: > "$SUMMARY"
failed=0

STEPS=" ${GPU_TEST_STEPS:-build check-build cuda-tests memcheck racecheck bench} "
wanted() { [[ $STEPS == *" $1 "* ]]; }

step() {  # step NAME COMMAND...: runs COMMAND, logs to $REPORT/NAME.log, records the outcome
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$SUMMARY"
  if "$@" > "$REPORT/$name.log" 2>&1; then
    echo "   ok ($((SECONDS - t0)) s)" | tee -a "$SUMMARY"
  else
    echo "   FAILED ($((SECONDS - t0)) s), see $REPORT/$name.log; its tail:" | tee -a "$SUMMARY"
    tail -n 15 "$REPORT/$name.log" | sed 's/^/   | /' | tee -a "$SUMMARY"
    failed=1
  fi
}

{
  echo "torch_tfgrads GPU test kit, $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi: not available"
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda, '| GPU visible:', torch.cuda.is_available())"
  echo "nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || echo missing)"
} | tee -a "$SUMMARY"

ARCH=$("$PY" -c "import torch; c = torch.cuda.get_device_capability(); print(f'{c[0]}.{c[1]}')" 2>/dev/null)
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-${ARCH:-9.0}}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
if wanted build; then
  step build env FORCE_CUDA=1 "$PY" setup.py -q build_ext --inplace
  # Where the build's minutes went (ninja's log: start and end in ms per object), for the
  # next lease: the five slowest objects into the summary.
  log=$(ls -t build/temp.*/.ninja_log 2> /dev/null | head -n 1)
  if [ -n "$log" ]; then
    cp "$log" "$REPORT/ninja_log.txt"
    awk 'NR > 1 { printf "   %6.1f s  %s\n", ($2 - $1) / 1000, $4 }' "$log" | sort -rn | head -n 5 \
      | sed 's|[^ ]*/csrc/|csrc/|' | tee -a "$SUMMARY"
  fi
fi
# A crash in the Python steps prints its native stack too (tools/native_backtrace.c, preloaded;
# after faulthandler's Python stack under pytest): the machine has no debugger.
NB=build/native_backtrace.so
mkdir -p build
PRELOAD=()
if ${CC:-cc} -shared -fPIC -O1 -o "$NB" tools/native_backtrace.c -ldl 2>> "$SUMMARY"; then
  PRELOAD=(LD_PRELOAD="$PWD/$NB${LD_PRELOAD:+:$LD_PRELOAD}")
else
  echo "native backtraces: tools/native_backtrace.c did not build, crashes print Python stacks only" \
    | tee -a "$SUMMARY"
fi
wanted check-build && step check-build env "${PRELOAD[@]}" "$PY" -m torch_tfgrads check-build --require-cuda
if wanted cuda-tests; then
  step cuda-tests env "${PRELOAD[@]}" TFGRADS_REQUIRE_CUDA=1 \
    "$PY" -m pytest -q -rs -m needs_cuda -p no:cacheprovider tests
  grep -E "passed|failed" "$REPORT/cuda-tests.log" | tail -n 1 | sed 's/^/cuda tests: /' \
    | tee -a "$SUMMARY"
fi
for tool in memcheck racecheck; do
  wanted $tool || continue
  if command -v compute-sanitizer > /dev/null 2>&1; then
    step $tool compute-sanitizer --tool $tool --error-exitcode 1 "$PY" tools/cuda_smoke.py
  else
    echo "== compute-sanitizer: not found, $tool NOT run" | tee -a "$SUMMARY"
    failed=1
  fi
done
if wanted bench; then
  for b in fused_batch_norm fractional_pool depthwise_conv2d cudnn_rnn; do
    step "bench-$b" env "${PRELOAD[@]}" timeout "${BENCH_TIMEOUT:-60}" \
      "$PY" "benchmarks/bench_$b.py" --device cuda --quick
  done
fi
echo "gpu-test: $([ $failed = 0 ] && echo OK || echo FAILED); report in $REPORT" | tee -a "$SUMMARY"
exit $failed
