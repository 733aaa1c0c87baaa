#!/bin/bash
# Profile configurations at 4096^3 with Nsight Compute: throughput, stall reasons and the
# SASS lines where warps stall most (SourceCounters).
set -u
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters"
i=0
for name in "$@"; do
  i=$((i+1))
  ncu $SECTIONS --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum" \
      -k regex:nm_spmm --launch-skip 1 --launch-count 1 --print-details all \
      python3 tools/profile_one.py "$name" --launches 2 > "$OUT/ncu_$i.txt" 2>&1
done
