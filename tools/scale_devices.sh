#!/usr/bin/env bash
# The multi-GPU tuning measurement: the same tuning job on one GPU and on every GPU of the host,
# each with a fresh tuned database, a fresh Optuna journal and a fresh CuPy kernel cache,
# both through the --devices supervisor, timed end to end by the shell.
#
#   tools/scale_devices.sh OUT [SHAPES] [PATTERN] [TRIALS]
#   e.g. tools/scale_devices.sh "$OUT" shapes/llama20.txt 8:32 16
#
# OUT receives one.log, all.log, one_show.txt, all_show.txt and walls.txt.
# Where Python packages were installed without .pyc files (pip --no-compile with
# PYTHONDONTWRITEBYTECODE set, as on the device machines), byte-compile them first
# (python3 -m compileall -q SITE nmgen): every process would otherwise compile them on
# import, seconds of each run's start.
set -euo pipefail
out=${1:?output folder}
shapes=${2:-shapes/llama20.txt}
pattern=${3:-8:32}
trials=${4:-16}
gpu=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceProperties(0)['name'].decode())" \
      | grep -oiE 'h100|h200' | tr 'A-Z' 'a-z')
mkdir -p "$out"
python3 "$(dirname "$0")/warm_up.py" "$gpu" "$pattern"  # no cold start in the first timed run
work=$(mktemp -d)
for run in one all; do
    devices=$([ "$run" = one ] && echo 0 || echo all)
    export CUPY_CACHE_DIR="$work/cupy_$run"
    start=$(date +%s%N)
    set +e
    python3 -m nmgen.cli tune --gpu "$gpu" --shapes "$shapes" --pattern "$pattern" --vec 32 \
        --trials "$trials" --db "sqlite:///$work/$run.db" --devices "$devices" \
        > "$out/$run.log" 2>&1
    rc=$?
    set -e
    end=$(date +%s%N)
    echo "$run devices=$devices rc=$rc wall_ms=$(( (end - start) / 1000000 ))" | tee -a "$out/walls.txt"
    python3 -m nmgen.cli show --db "sqlite:///$work/$run.db" > "$out/${run}_show.txt" 2>&1 || true
done
python3 - "$out/walls.txt" <<'PY'
import sys
walls = dict(line.split()[0:1] + [int(line.split("wall_ms=")[1])] for line in open(sys.argv[1]))
print(f"ratio all/one: {walls['all'] / walls['one']:.3f}")
PY
# Tuned results of the two runs, shape by shape: winner time on all GPUs / on one GPU.
python3 "$(dirname "$0")/winners_ratio.py" "$out/one_show.txt" "$out/all_show.txt" all/one \
    | tee -a "$out/walls.txt"
