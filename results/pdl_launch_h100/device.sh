#!/usr/bin/env bash
# The device steps that landed the main kernel's programmatic launch after A's copy
# (thirty-first session; README.md beside this file). Run with `run`, carrying .whl and
# build/old_tree (`git archive` of nmgen/ and templates/ before the change):
#
#   bash results/pdl_launch_h100/device.sh tests 4:32 8:32   # GPU tests, then carry
#   bash results/pdl_launch_h100/device.sh carry 16:32 12:32 # carry only
#
# "tests" stops before the carry if a GPU test fails. The carry re-keys the tuned records
# of kernels whose source did not change and times again, on this GPU, the changed `tx`
# kernels among each problem's 3 fastest (and the hand-picked kernel where it lacks a
# record); the database comes back in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?set by the device tool}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m compileall -q /tmp/site nmgen >/dev/null 2>&1
what=$1
shift
if [[ $what == tests ]]; then
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > "$out/gpu_tests.txt" 2>&1
    rc=$?
    cp tests/gpu_attestation.json "$out/"
    tail -3 "$out/gpu_tests.txt"
    (( rc == 0 )) || { echo "GPU tests failed: no carry"; exit 1; }
fi
for pattern in "$@"; do
    start=$SECONDS
    python3 -m nmgen.cli carry --tree build/old_tree \
        --db sqlite:///tuned_db/tuned.sqlite --remeasure 3 --pattern "$pattern" \
        > "$out/carry_${pattern/:/_}.txt" 2>&1
    echo "carry $pattern: rc=$? $(( SECONDS - start )) s" | tee -a "$out/steps.txt"
    tail -4 "$out/carry_${pattern/:/_}.txt"
done
cp tuned_db/tuned.sqlite "$out/"
