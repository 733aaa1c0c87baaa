#!/usr/bin/env bash
# A full tune of the 100 Llama shapes for one pattern and layout, from an empty tuned
# database, CuPy kernel cache and nmgen cache, timed by the shell:
#
#   tools/timed_tune.sh OUT 8:32 km [more nmgen tune options]
#
# OUT receives tune.log, wall.txt and tune_<n>_<m>_<layout>.db (merge it into another
# database with tools/merge_tuned.py). A run cut short resumes when run again with the
# same OUT (its Optuna journal is kept beside the database).
set -euo pipefail
out=${1:?output folder}; pattern=${2:?pattern, e.g. 8:32}; layout=${3:?layout: rm or km}
shift 3
gpu=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceProperties(0)['name'].decode())" \
      | grep -oiE 'h100|h200' | tr 'A-Z' 'a-z')
mkdir -p "$out"
db="$out/tune_${pattern/:/_}_$layout.db"
CUPY_CACHE_DIR=$(mktemp -d) NMGEN_CACHE_DIR=$(mktemp -d)
export CUPY_CACHE_DIR NMGEN_CACHE_DIR
start=$(date +%s%N)
set +e
python3 -m nmgen.cli tune --gpu "$gpu" --shapes shapes/llama.txt --pattern "$pattern" \
    --vec 32 --layout "$layout" --db "sqlite:///$db" "$@" >> "$out/tune.log" 2>&1
rc=$?
set -e
end=$(date +%s%N)
echo "pattern=$pattern layout=$layout rc=$rc wall_ms=$(( (end - start) / 1000000 ))" \
    | tee -a "$out/wall.txt"
