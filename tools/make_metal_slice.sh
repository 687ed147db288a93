#!/usr/bin/env bash
# Regenerate .ci/metal-slice: run the device-generic tests on the Metal device over the fake Objective-C
# runtime (DEV=METAL METAL_MOCK=1: the real driver's call path through libffi, every dispatched kernel's MSL
# built with the host C++ compiler through the shim and run with lane fibers) and keep the node ids of those
# that passed and ran at least one kernel there (tests/ci_policy.py counts gpu.run_dispatch calls). Tests
# over SLICE_MAX_SECONDS are left out (listed at the end), so the CI stage stays within its budget (~2-3
# minutes on 2 cores). Tests that fail on Metal are left out by construction: float64 (Metal has no 64-bit
# float; the renderer refuses it by name) and anything docs/metal.md lists. Rerun after adding or renaming
# device tests (CI fails on a slice id that no longer exists, and on a slice test that launches nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
# the op, TinyJit, saved-graph and scalar-argument files plus the HCQ conformance suite and MiniLM's parity
# with the CPU device (~6 s); left out as for the AMD slice: training and the 12-sentence model tests
# (minutes on the host-built MSL), CI/CLI tests, CPU-device tests
files=$(ls tests/test_ops_*.py tests/test_jit*.py tests/test_scalar_args.py tests/test_gather.py \
  tests/test_assign_view.py tests/test_silent_wrong_values.py tests/test_schedule_cache.py)
DEV=METAL METAL_MOCK=1 RAWGRAD_WRITE_DEVICE_SLICE="$out" RAWGRAD_SLICE_MAX_SECONDS="${SLICE_MAX_SECONDS:-6}" \
  python3 -m pytest -q -p no:cacheprovider tests/hcq/test_conformance.py $files \
  tests/models/test_minilm_device.py "$@" \
  || true  # failures (float64) are simply not in the slice
mv "$out" .ci/metal-slice
echo "wrote .ci/metal-slice: $(wc -l < .ci/metal-slice) tests"
