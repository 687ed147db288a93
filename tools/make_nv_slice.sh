#!/usr/bin/env bash
# Regenerate .ci/nv-slice: run the device-generic tests on the mock NV GPU and keep the node ids of those
# that launched at least one kernel there (tests/ci_policy.py counts the kernels the mock GPU executes).
# Run it after adding or renaming device tests; CI fails on a slice id that no longer exists, and on a
# test in the slice that stops launching kernels. Takes several minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
# every device-generic test file; the model and training tests are too slow for the PTX interpreter in CI
files=$(ls tests/test_*.py | grep -v -e test_training.py -e test_ci_script.py -e test_mutation_table.py)
DEV=NV NV_MOCK=1 RAWGRAD_WRITE_DEVICE_SLICE="$out" python3 -m pytest -q -p no:cacheprovider $files "$@"
mv "$out" .ci/nv-slice
echo "wrote .ci/nv-slice: $(wc -l < .ci/nv-slice) tests"
