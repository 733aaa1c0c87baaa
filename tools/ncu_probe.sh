#!/bin/bash
# Profile configurations at 4096^3 with Nsight Compute: throughput, stall reasons and the
# SASS lines where warps stall most (SourceCounters). PROFILE_ARGS go to
# tools/profile_one.py, e.g. PROFILE_ARGS="--rows 4224" for 4224x4096x4096, where the
# stream-K kernel and the data-parallel one of the same tiles both run whole waves:
#   PROFILE_ARGS="--rows 4224" bash tools/ncu_probe.sh \
#     nm_spmm_f32_n16m32l32_ms128ns256ks64_mt16nt8_w8x4_nopack_s2_k1_km_sm90 \
#     nm_spmm_f32_n16m32l32_ms128ns256ks64_mt16nt8_w8x4_nopack_s2_k1_streamk_km_sm90
# KERNELS: the regex of the kernels profiled (default nm_spmm; e.g. nm_wgmma, or nm_ for any).
set -u
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters"
i=0
for name in "$@"; do
  i=$((i+1))
  ncu $SECTIONS --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum" \
      -k regex:${KERNELS:-nm_spmm} --launch-skip 1 --launch-count 1 --print-details all \
      python3 tools/profile_one.py "$name" --launches 2 ${PROFILE_ARGS:-} > "$OUT/ncu_$i.txt" 2>&1
done
