#!/usr/bin/env bash
# Search and storage overhead of the tuner, no GPU: `nmgen tune --dry-run` (the model
# measures) of the same shapes with one worker and with two (--devices 0 / 0,1), from two
# trees in turns, e.g. the last commit against the working tree:
#
#   git archive HEAD nmgen templates pyproject.toml | tar -x -C /tmp/base
#   tools/dryrun_workers_ab.sh OUT /tmp/base . 2
#
# Prints, and appends to OUT/walls.txt, a line a run: tree, workers, wall and each
# worker's Optuna seconds (from its "worked on" line); OUT keeps the logs.
set -euo pipefail
out=${1:?output folder}; base=$(cd "${2:?base tree}" && pwd); new=$(cd "${3:?new tree}" && pwd)
rounds=${4:-2}
shapes=$(cd "$(dirname "$0")/.." && pwd)/results/scale_h200x2/shapes20.txt
mkdir -p "$out"; out=$(cd "$out" && pwd)
work=$(mktemp -d)
for round in $(seq "$rounds"); do
    for tree in base new; do
        dir=$base; [ "$tree" = new ] && dir=$new
        for devices in 0 0,1; do
            name="${tree}_${devices/,/+}_$round"
            start=$(date +%s%N)
            (cd "$dir" && python3 -m nmgen.cli tune --gpu h200 --shapes "$shapes" --pattern 8:32 \
                --vec 32 --trials 40 --db "sqlite:///$work/$name.db" --dry-run --compile-top 0 \
                --devices "$devices" > "$out/$name.log" 2>&1)
            end=$(date +%s%N)
            optuna=$(grep "worked on" "$out/$name.log" | grep -oE "optuna [0-9.]+ s" \
                     | awk '{print $2}' | paste -sd/)
            echo "$name workers=$devices wall_ms=$(( (end - start) / 1000000 )) optuna_s=$optuna" \
                | tee -a "$out/walls.txt"
        done
    done
done
rm -rf "$work"
