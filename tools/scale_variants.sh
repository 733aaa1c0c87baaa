#!/usr/bin/env bash
# Issue 5's comparison with variants: several tuning runs of the same shapes in a row on
# one host, each with a fresh tuned database, Optuna journal and CuPy kernel cache, timed
# end to end by the shell. Each RUN is LABEL:DEVICES[:OPTION=VALUE,...], e.g.
#
#   tools/scale_variants.sh OUT SHAPES PATTERN TRIALS one:0 all:all all3:all:ahead-workers=3
#
# OUT receives LABEL_N.log, LABEL_N_show.txt and walls.txt (a line a run: its wall time,
# the compile time summed over its workers' studies, and the kernels NVRTC compiled with
# their mean CPU time, which shows how fast the host ran). The option tree=DIR runs nmgen
# from another tree (e.g. `git archive REV nmgen templates pyproject.toml | tar -x -C DIR`)
# instead of this one, for an A/B of two versions on one machine.
set -euo pipefail
out=${1:?output folder}; shapes=${2:?shapes}; pattern=${3:?pattern}; trials=${4:?trials}
shift 4
gpu=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceProperties(0)['name'].decode())" \
      | grep -oiE 'h100|h200' | tr 'A-Z' 'a-z')
mkdir -p "$out"
python3 "$(dirname "$0")/warm_up.py" "$gpu" "$pattern"  # no cold start in the first timed run
work=$(mktemp -d)
n=0
for spec in "$@"; do
    n=$((n + 1))
    IFS=: read -r label devices options <<< "$spec"
    extra=()
    tree=$PWD
    for opt in ${options//,/ }; do
        if [ "${opt%%=*}" = tree ]; then tree=$(cd "${opt#*=}" && pwd); continue; fi
        extra+=("--${opt%%=*}" "${opt#*=}")
    done
    name="${label}_$n"
    export CUPY_CACHE_DIR="$work/cupy_$name"
    start=$(date +%s%N)
    set +e
    PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 -m nmgen.cli tune --gpu "$gpu" --shapes "$shapes" --pattern "$pattern" --vec 32 \
        --trials "$trials" --db "sqlite:///$work/$name.db" --devices "$devices" \
        "${extra[@]}" > "$out/$name.log" 2>&1
    rc=$?
    set -e
    end=$(date +%s%N)
    compile=$(grep "worked on" "$out/$name.log" | grep -oE "compile [0-9.]+ s" \
              | awk '{s += $2} END {printf "%.1f", s}')
    # NVRTC's work over both pools of every worker: kernels compiled, CPU seconds.
    nvrtc=$(grep -hoE "[0-9]+ compiled, [0-9.]+ CPU-s each; [0-9.]+ CPU-s" "$out/$name.log" \
            | awk '{n += $1; s += $6} END {if (n) printf "%d kernels %.2f CPU-s each", n, s / n}')
    echo "$name devices=$devices options=${options:-none} rc=$rc" \
         "wall_ms=$(( (end - start) / 1000000 )) compile_sum_s=$compile nvrtc=${nvrtc:-none}" \
        | tee -a "$out/walls.txt"
    python3 -m nmgen.cli show --db "sqlite:///$work/$name.db" > "$out/${name}_show.txt" 2>&1 || true
done
