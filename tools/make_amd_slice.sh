#!/usr/bin/env bash
# Regenerate .ci/amd-slice: run the device-generic tests on the mock AMD GPU (mock KFD + command processor +
# RDNA3 interpreter, DEV=AMD AMD_MOCK=1) and keep the node ids of those that passed and launched at least one
# kernel there (tests/ci_policy.py counts the kernels the command processor executes). Tests that took longer
# than SLICE_MAX_SECONDS are left out (listed at the end of the run), so the CI stage stays within its time
# budget (~4 minutes on the 2-core CI machine). Tests that fail on the mock (interpreter gaps: docs/amd.md)
# are left out by construction; rerun this after the interpreter gains instructions, or after adding or
# renaming device tests (CI fails on a slice id that no longer exists, and on a slice test that stops
# launching kernels). Takes about 3 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
# every device-generic test file, plus the HCQ conformance suite and the MiniLM parity test. Left out: the
# training tests (too slow for the interpreter), tests about CI or the command line (no device work of their
# own), and test_cpu_device_exit (CPU-device specific: it launches nothing on AMD but takes 90 s).
files=$(ls tests/test_*.py | grep -v -e test_training.py -e test_ci_script.py -e test_mutation_table.py \
  -e test_ci_environment.py -e test_cli.py -e test_cli_first_contact.py -e test_first_contact.py \
  -e test_doctor.py -e test_layering.py -e test_bench_protocols.py -e test_cpu_device_exit.py)
DEV=AMD AMD_MOCK=1 RAWGRAD_WRITE_DEVICE_SLICE="$out" RAWGRAD_SLICE_MAX_SECONDS="${SLICE_MAX_SECONDS:-8}" \
  python3 -m pytest -q -p no:cacheprovider tests/hcq/test_conformance.py $files tests/models/test_minilm_device.py \
  "$@" || true  # failures are interpreter gaps: they are simply not in the slice
mv "$out" .ci/amd-slice
echo "wrote .ci/amd-slice: $(wc -l < .ci/amd-slice) tests"
