#!/usr/bin/env bash
# The multi-GPU tuning measurement: the same tuning job on one GPU, on two and (where the
# host has them) on four, each from an empty tuned database, Optuna journal, nmgen cache
# and CuPy kernel cache, through the --devices supervisor, timed end to end by the shell;
# then every run's winners timed again in one process (tools/retime_winners.py).
#
#   tools/scale_devices.sh OUT [SHAPES] [PATTERN] [TRIALS] [RUNS]
#   e.g. tools/scale_devices.sh "$OUT" shapes/llama.txt 8:32 40 "one two four"
#
# OUT receives <run>.log (each worker's time by phase on its last line), <run>_show.txt,
# walls.txt, winners.json and summary.json (one_gpu_s, two_gpu_s, four_gpu_s,
# winners_geomean_two, winners_geomean_four: the one-GPU winners' time over the others').
# A run may be split over calls on one machine: runs whose wall is in walls.txt are kept.
# Where Python packages were installed without .pyc files (pip --no-compile with
# PYTHONDONTWRITEBYTECODE set, as on the device machines), byte-compile them first
# (python3 -m compileall -q SITE nmgen): every process would otherwise compile them on
# import, seconds of each run's start.
set -euo pipefail
out=${1:?output folder}
shapes=${2:-shapes/llama.txt}
pattern=${3:-8:32}
trials=${4:-40}
runs=${5:-one two four}
here=$(dirname "$0")
gpu=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceProperties(0)['name'].decode())" \
      | grep -oiE 'h100|h200' | tr 'A-Z' 'a-z')
count=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())")
work=$out/work  # databases and caches, kept for a later call's retiming
mkdir -p "$out" "$work"
touch "$out/walls.txt"
python3 "$here/warm_up.py" "$gpu" "$pattern"  # no cold start in the first timed run
declare -A devices=([one]=0 [two]=0,1 [four]=0,1,2,3) needs=([one]=1 [two]=2 [four]=4)
for run in $runs; do
    (( count >= needs[$run] )) || { echo "$run: $count GPUs here, skipped"; continue; }
    grep -q "^$run " "$out/walls.txt" && continue
    rm -rf "$work/$run" && mkdir -p "$work/$run"
    export CUPY_CACHE_DIR="$work/$run/cupy" NMGEN_CACHE_DIR="$work/$run/nmgen"
    start=$(date +%s%N)
    set +e
    python3 -m nmgen.cli tune --gpu "$gpu" --shapes "$shapes" --pattern "$pattern" --vec 32 \
        --trials "$trials" --db "sqlite:///$work/$run/tuned.db" --devices "${devices[$run]}" \
        --quiet > "$out/$run.log" 2>&1
    rc=$?
    set -e
    end=$(date +%s%N)
    echo "$run devices=${devices[$run]} rc=$rc wall_ms=$(( (end - start) / 1000000 ))" \
        | tee -a "$out/walls.txt"
    python3 -m nmgen.cli show --db "sqlite:///$work/$run/tuned.db" > "$out/${run}_show.txt" 2>&1 || true
done
done_runs=$(awk '{printf "%s ", $1}' "$out/walls.txt")
[[ " $done_runs " == *" one "* ]] || exit 0
# Every run's winners in one process, on one kernel cache (the runs' compiles reused).
export CUPY_CACHE_DIR="$work/retime_cupy" NMGEN_CACHE_DIR="$work/retime_nmgen"
mkdir -p "$CUPY_CACHE_DIR"
dbs=()
for run in $done_runs; do
    cp -rn "$work/$run/cupy/." "$CUPY_CACHE_DIR/" 2>/dev/null || true
    dbs+=("$run=sqlite:///$work/$run/tuned.db")
done
python3 "$here/retime_winners.py" "$out/winners.json" "${dbs[@]}" > "$out/retime.log" 2>&1
python3 - "$out" "$shapes" "$pattern" "$trials" "$gpu" <<'PY'
import json, subprocess, sys, time
out, shapes, pattern, trials, gpu = sys.argv[1:]
walls = {line.split()[0]: int(line.split("wall_ms=")[1]) / 1000
         for line in open(f"{out}/walls.txt") if line.strip()}
winners = json.load(open(f"{out}/winners.json"))
device = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                        capture_output=True, text=True).stdout.split("\n")[0]
summary = {f"{run}_gpu_s": round(s, 1) for run, s in walls.items()}
summary.update({f"ratio_{run}": round(walls[run] / walls["one"], 3) for run in walls if run != "one"})
summary.update({f"winners_{k}": round(v, 4) for k, v in winners.items() if k.startswith("geomean_")})
for run in ("one", "two", "four"):  # a run the host had too few GPUs for: null
    summary.setdefault(f"{run}_gpu_s", None)
    if run != "one":
        summary.setdefault(f"winners_geomean_{run}", None)
summary.update(problems=winners["problems"], shapes=shapes, pattern=pattern, vec=32,
               trials=trials, device=f"{len(walls)} runs on {device}",
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               command=f"tools/scale_devices.sh OUT {shapes} {pattern} {trials}")
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
