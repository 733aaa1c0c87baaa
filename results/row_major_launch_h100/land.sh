#!/usr/bin/env bash
# Lands in_stream_launcher.patch in one device call: applies it to the device's copy of
# the tree, runs the GPU tests on it, then times it (README.md beside this file, part 4):
#
#   bash results/row_major_launch_h100/land.sh [STEP ...]   # run carries .whl; writes to $OUT
#
# Steps, in this order by default (name some to run only those, e.g. two calls when one
# cannot hold them all):
#   gpu_tests        gpu_tests.txt and gpu_attestation.json (the record to commit once
#                    the same patch is applied here)
#   in_stream3/4     in_stream_run3.md, in_stream_run4.md: two processes of
#                    tools/in_stream_copy_ab.py
#   pipeline_before  pipeline_before.md: every tuned problem the launcher pipelines, the
#                    new schedule beside the old
#   in_stream_pdl    in_stream_pdl_run1.md (tools/in_stream_pdl_ab.py, not run before)
# steps.txt says how long each took; a step is skipped where less of the call's LIMIT_S
# (590 s) is left than it needs.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?set by the device tool}
limit=${LIMIT_S:-590}
start=$SECONDS

ls .whl/*.whl >/dev/null 2>&1 || { echo "no .whl/: run with carry [\".whl\"]"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m compileall -q /tmp/site nmgen >/dev/null 2>&1
git apply results/row_major_launch_h100/in_stream_launcher.patch || { echo "patch does not apply"; exit 1; }

step() {  # step NAME NEEDS_S COMMAND...: runs COMMAND if NEEDS_S seconds are left
    local name=$1 needs=$2 t0=$SECONDS
    shift 2
    if (( limit - (SECONDS - start) < needs )); then
        echo "$name: skipped, $(( limit - (SECONDS - start) )) s left" | tee -a "$out/steps.txt"
        return
    fi
    "$@"
    echo "$name: rc=$? $(( SECONDS - t0 )) s" | tee -a "$out/steps.txt"
}

gpu_tests() {
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > "$out/gpu_tests.txt" 2>&1
    local rc=$?
    cp tests/gpu_attestation.json "$out/"
    tail -3 "$out/gpu_tests.txt"
    return $rc
}

in_stream() {  # in_stream RUN
    python3 tools/in_stream_copy_ab.py --pattern 4:32,8:32,16:32,12:32 --rounds 9 \
        --out "$out/in_stream_run$1.md" > "$out/in_stream_run$1.txt" 2>&1
}

run() {  # run STEP: one step by name, with the seconds it needs at the least
    case $1 in
        gpu_tests) step gpu_tests 240 gpu_tests ;;
        in_stream3) step in_stream3 60 in_stream 3 ;;
        in_stream4) step in_stream4 60 in_stream 4 ;;
        pipeline_before) step pipeline_before 150 python3 tools/pipeline_ab.py \
            --shapes shapes/llama.txt --db sqlite:///tuned_db/tuned.sqlite --before \
            --out "$out/pipeline_before.md" ;;
        in_stream_pdl) step in_stream_pdl 45 python3 tools/in_stream_pdl_ab.py \
            --pattern 4:32,8:32 --rounds 9 --out "$out/in_stream_pdl_run1.md" ;;
        *) echo "unknown step $1" | tee -a "$out/steps.txt" ;;
    esac
}

(( $# )) || set -- gpu_tests in_stream3 in_stream4 pipeline_before in_stream_pdl
for name in "$@"; do run "$name"; done
