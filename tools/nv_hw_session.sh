#!/usr/bin/env bash
# The first minutes on a lent H100/H200, in one command (see rawgrad/drivers/nv/README.md, "First hardware
# session"). Each stage writes its log under $OUT (default ./nv-out) and the script goes on after a failed
# stage, so one call answers as much as it can; the summary at the end says which stages passed and lists
# the failed ones. A stage fails when its command exits non-zero (a timeout included; the env stage's
# informational commands excepted); the script then exits 1 (2 for an unknown stage name).
#
#   tools/nv_hw_session.sh [stage ...]   stages: env smoke hw ops ci bench decode full
#                                        (default: env smoke hw ops bench, ~5 min; then `full decode` in a
#                                        second call: the whole test suite with DEV=NV)
#
# Expects cffi/pycparser importable (carry them as wheels: the device README) and ptxas on PATH, under
# /usr/local/cuda, or from the `nv` extra. Guesses: smoke ~1 min, hw+ops ~2 min, ci ~4 min, bench ~2 min,
# full up to 8 min (every kernel assembled by ptxas once per call: the cache is in /tmp, not $OUT, which brings back at
# most 8 files).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/nv-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" RAWGRAD_CACHE_DIR=/tmp/rawgrad-cache
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(env smoke hw ops bench)
declare -A RESULT
FAILED=()

stage() {  # stage NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  RESULT[$name]="rc=$rc $((SECONDS - t0))s"
  if [ "$rc" -ne 0 ]; then
    FAILED+=("$name")
    RESULT[$name]+=" FAILED$([ "$rc" -ge 124 ] && [ "$rc" -le 137 ] && echo " (timeout or killed)")"
  fi
  tail -n 25 "$OUT/$name.log"
}

CI_FILES="tests/test_hcq_core.py tests/test_jit.py tests/test_jit_graph.py tests/test_jit_storage.py
  tests/test_ops_elementwise.py tests/test_ops_movement.py tests/test_ops_reduce.py tests/test_ops_nn.py
  tests/test_nn.py tests/test_nn_optim.py tests/test_tensor_random.py tests/test_codegen.py tests/test_gather.py
  tests/test_assign_view.py tests/test_safetensors.py tests/test_autograd.py tests/test_autograd_api.py
  tests/test_profile.py tests/test_schedule.py tests/test_tensor_basic.py tests/test_view.py"

for s in "${STAGES[@]}"; do
  case $s in
    # informational commands may fail (no ptxas on PATH is fine with the nv extra); then set -e: the
    # imports and the doctor decide the stage
    env) stage env 60 bash -c 'nvidia-smi; cat /proc/driver/nvidia/version; ls -l /dev/nvidia*; uname -a;
                               which ptxas; ls /usr/local/cuda/bin 2>&1 | head; set -e
                               python3 -c "import cffi, numpy; print(cffi.__version__, numpy.__version__)"
                               python3 -m rawgrad doctor --verbose' ;;
    smoke) stage smoke 180 python3 -m rawgrad smoke ${NV_MOCK:+--mock} --json "$OUT/nv_smoke.json" ;;
    hw) stage hw 120 python3 -m pytest -q -x -p no:cacheprovider tests/nv -m nv ;;
    ops) DEV=NV stage ops 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_hcq_core.py tests/test_ops_elementwise.py ;;
    # shellcheck disable=SC2086
    ci) DEV=NV stage ci 420 python3 -m pytest -q -p no:cacheprovider --durations=10 $CI_FILES ;;
    bench) DEV=NV stage bench 420 python3 -m rawgrad bench gpu ;;
    full) DEV=NV stage full 480 python3 -m pytest -q -p no:cacheprovider --durations=15 tests ;;
    decode) DEV=NV stage decode 240 python3 -c "from rawgrad.models import gpt2; print(gpt2.bench_decode(64))" ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
dmesg 2>/dev/null | grep -iE "NVRM|Xid" | tail -n 40 >"$OUT/dmesg.log"
echo "=== summary"
for s in "${STAGES[@]}"; do echo "$s: ${RESULT[$s]:-not run}"; done
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "failed stages: ${FAILED[*]} (logs: $OUT/<stage>.log)"
  exit 1
fi
echo "all stages passed"
