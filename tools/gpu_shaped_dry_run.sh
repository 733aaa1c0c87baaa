#!/usr/bin/env bash
# Multi-worker tuning shaped like a GPU tune, on a CPU host: `nmgen tune --dry-run` of the
# whole seed set with one, two and four workers (--devices), on a copy of a commit's tree
# whose model measurer sleeps where the GPU works: SCALE x (0.088 s a trial measured,
# 0.116 s a problem's data, 0.16 s a confirmation), the four-H200 run's means
# (docs/engineering-notes.md §10), and whose dry run cross-checks. Sleeping takes no CPU,
# so four workers overlap as four GPUs would; compiling is not modelled, and a small
# host's cores are shared by the workers' own work (Optuna, the databases).
#
#   tools/gpu_shaped_dry_run.sh OUT COMMIT [SCALE] [RUNS]
#   e.g. tools/gpu_shaped_dry_run.sh /tmp/shaped HEAD 0.5 "0 0,1 0,1,2,3"
#
# OUT receives each run's log and walls.txt: a line a run, its wall and its workers' exits.
set -euo pipefail
out=${1:?output folder}; commit=${2:?commit}; scale=${3:-0.5}; runs=${4:-0 0,1 0,1,2,3}
mkdir -p "$out"; out=$(cd "$out" && pwd)
tree=$(mktemp -d)
git -C "$(dirname "$0")/.." archive "$commit" | tar -x -C "$tree"
python3 - "$tree" <<'PY'
import sys
root = sys.argv[1]
path = f"{root}/nmgen/tune/measurers.py"
text = open(path).read()
patched = text.replace('''    def measure(self, config: Config, model_ms: float) -> Outcome:
        return TrialStatus.MODEL, model_ms, None
''', '''    def measure(self, config: Config, model_ms: float) -> Outcome:
        scale = float(__import__("os").environ["SHAPED_SCALE"])
        if not getattr(self, "_made", False):
            self._made, self.data_s = True, 0.116 * scale
            time.sleep(self.data_s)
        time.sleep(0.088 * scale)
        return TrialStatus.MODEL, model_ms, None
''').replace('''        """The model gives the same estimate every time."""
''', '''        """The model gives the same estimate every time."""
        time.sleep(0.16 * float(__import__("os").environ["SHAPED_SCALE"]))
''')
assert patched.count("SHAPED_SCALE") == 2, "measurers.py changed: update the patch"
open(path, "w").write(patched)
path = f"{root}/nmgen/tune/workers.py"
text = open(path).read()
patched = text.replace("not unfinished and not tuner.dry_run and tuner.cross_checks",
                       "not unfinished and tuner.cross_checks")
assert patched != text, "workers.py changed: update the patch"
open(path, "w").write(patched)
PY
export SHAPED_SCALE=$scale NMGEN_CACHE_DIR=${NMGEN_CACHE_DIR:-$out/cache}
for devices in $runs; do
    name="$(git -C "$(dirname "$0")/.." rev-parse --short "$commit")_${devices//,/+}"
    rm -f "$out/$name.db" "$out/$name.db.optuna-journal"*
    start=$(date +%s%N)
    (cd "$tree" && python3 -m nmgen.cli tune --gpu h200 --shapes shapes/llama.txt --pattern 8:32 \
        --vec 32 --trials 40 --db "sqlite:///$out/$name.db" --dry-run --compile-top 0 \
        --devices "$devices" --quiet > "$out/$name.log" 2>&1)
    end=$(date +%s%N)
    exits=$(grep -o 'exited after [0-9.]* s' "$out/$name.log" | awk '{print $3}' | paste -sd/)
    echo "$name wall_ms=$(( (end - start) / 1000000 )) exits_s=$exits" | tee -a "$out/walls.txt"
done
rm -rf "$tree"
