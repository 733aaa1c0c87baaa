#!/usr/bin/env bash
# How long one GPU takes to tune the same shapes with two versions of nmgen: an older
# source tree (nmgen/ and templates/, e.g. `git archive REV nmgen templates | tar -x -C DIR`)
# and the working tree. Each run gets a fresh tuned database, Optuna journal and CuPy
# kernel cache, goes through the same --devices path, and is timed end to end by the shell.
#
#   tools/tune_speed_ab.sh OUT OLD_TREE [SHAPES] [PATTERN] [TRIALS]
#   e.g. tools/tune_speed_ab.sh "$OUT" build/old_tree results/scale_h200x2/shapes20.txt 8:32 40
#
# OUT receives old.log, new.log, old_show.txt, new_show.txt and walls.txt (the two wall
# times, their ratio, and the winners' times of the new run over the old one).
set -euo pipefail
out=${1:?output folder}
old_tree=$(cd "${2:?older source tree}" && pwd)
shapes=$(realpath "${3:-results/scale_h200x2/shapes20.txt}")
pattern=${4:-8:32}
trials=${5:-40}
root=$PWD
gpu=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceProperties(0)['name'].decode())" \
      | grep -oiE 'h100|h200' | tr 'A-Z' 'a-z')
mkdir -p "$out"
for tree in "$old_tree" "$root"; do  # no cold start in the first timed run
    PYTHONPATH="$tree:${PYTHONPATH:-}" python3 "$root/tools/warm_up.py" "$gpu" "$pattern" || true
done
out=$(realpath "$out")
work=$(mktemp -d)
for run in old new; do
    tree=$([ "$run" = old ] && echo "$old_tree" || echo "$root")
    export CUPY_CACHE_DIR="$work/cupy_$run"
    start=$(date +%s%N)
    set +e
    (cd "$tree" && PYTHONPATH="$tree:${PYTHONPATH:-}" python3 -m nmgen.cli tune --gpu "$gpu" \
        --shapes "$shapes" --pattern "$pattern" --vec 32 --trials "$trials" \
        --db "sqlite:///$work/$run.db" --devices 0 > "$out/$run.log" 2>&1)
    rc=$?
    set -e
    end=$(date +%s%N)
    echo "$run rc=$rc wall_ms=$(( (end - start) / 1000000 ))" | tee -a "$out/walls.txt"
    (cd "$tree" && PYTHONPATH="$tree:${PYTHONPATH:-}" python3 -m nmgen.cli show \
        --db "sqlite:///$work/$run.db" > "$out/${run}_show.txt" 2>&1) || true
done
python3 - "$out/walls.txt" <<'PY' | tee -a "$out/walls.txt"
import sys

walls = {line.split()[0]: int(line.split("wall_ms=")[1])
         for line in open(sys.argv[1]) if "wall_ms=" in line}
print(f"wall new/old: {walls['new'] / walls['old']:.3f}")
PY
python3 "$root/tools/winners_ratio.py" "$out/old_show.txt" "$out/new_show.txt" new/old \
    | tee -a "$out/walls.txt"
