"""The wgmma family's model: one stage of each block resident on an SM, from the stage's
copies, wgmmas and copy issue, beside the DRAM bytes and the waves (``tensor_core.model``).

A stage of a block:

- copy: the gathered A tile through L2 into shared memory, at ``A_COPY_BYTES_PER_CYCLE``
  an SM. The values' tile is read at the same time by the row blocks of its column block
  (``blockIdx.x`` runs fastest) and adds no measurable time beside it.
- tensor: the stage's wgmmas at ``TENSOR_TFLOPS`` of the GPU.
- issue: a copying thread's 16-byte copies, one after another (``COPY_ISSUE_CYCLES``
  each).

Shared copies (the MMA warpgroups copy, a block barrier a stage): a block waits for its
stage's copies, then issues the stage's wgmmas and the next copies, so with ``b`` blocks
on an SM one stage of each takes ``b·tensor + issue + max(b·copy, STAGE_LATENCY_CYCLES +
copy, (COPY_LATENCY_CYCLES + b·copy) / ahead)``, ``ahead = stages - 2`` stages in flight.

A producer warpgroup (``producer="warp"``): the copies run beside the wgmmas, and the
producer reads each stage's row indices before issuing its copies, behind
``PRODUCER_QUEUE_STAGES`` stages of every resident block's copies:
``max(b·(tensor + copy), PRODUCER_LATENCY_CYCLES + PRODUCER_QUEUE_STAGES·b·copy + issue)``.

A bulk-copy producer (``producer="tma"``) is estimated as its ``_ws`` twin until its own
times are fitted.

The constants were fitted on the H100 bf16 tune of 8:32 at L = 64 and 128 (row-major A,
1,540 trials of 64 problems): results/untuned_h100/bf16_tx/model_study_tensor_core.txt.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

from ...gpus import Arch, GpuSpec
from ...shapes import Shape
from ..tensor_core import model as tc
from ..tensor_core.model import Estimate, RankTable
from .config import WgmmaConfig

# wgmma dense peak (TFLOP/s, BF16/FP16 with FP32 accumulation) by GPU; other sm_90 GPUs
# are taken as TENSOR_OVER_FP32 times their FP32 peak.
TENSOR_TFLOPS = {"h100": 950.0, "h200": 950.0}
TENSOR_OVER_FP32 = 14.2
A_COPY_BYTES_PER_CYCLE = 80.0  # the gathered A tile into an SM's shared memory (H100 fit)
COPY_ISSUE_CYCLES = 24  # a copying thread's 16-byte copy, address to issue (H100 fit)
STAGE_LATENCY_CYCLES = 420  # a block's wait, fence, barrier and issue a stage (H100 fit)
COPY_LATENCY_CYCLES = 530  # a stage's copies from issue to landing (H100 fit)
PRODUCER_LATENCY_CYCLES = 630  # a producer's row indices, read a stage (H100 fit)
# The stages of copies a producer's index read waits behind, each resident block's: the
# stage it has just issued and the one before it, still landing (2 to 3 fit alike).
PRODUCER_QUEUE_STAGES = 2


class WgmmaStage(NamedTuple):
    """A stage of a block, in cycles of its SM (``tensor_core.model.Pipeline``)."""

    copy: float
    tensor: float
    issue: float
    ahead: int  # shared copies: stages in flight beside the one computed
    specialized: bool  # a producer warpgroup copies
    per_sm: int
    fill_cycles: float = tc.PIPELINE_FILL_CYCLES

    def round_cycles(self, blocks: int) -> float:
        """One stage of each of ``blocks`` resident blocks (see the module's note)."""
        b, copy = blocks, self.copy
        if self.specialized:
            queue = PRODUCER_QUEUE_STAGES * b * copy
            return max(b * (self.tensor + copy), PRODUCER_LATENCY_CYCLES + queue + self.issue)
        waits = max(b * copy, STAGE_LATENCY_CYCLES + copy,
                    (COPY_LATENCY_CYCLES + b * copy) / self.ahead)
        return b * self.tensor + self.issue + waits


def tensor_tflops(gpu: GpuSpec) -> float:
    return TENSOR_TFLOPS.get(gpu.name, TENSOR_OVER_FP32 * gpu.peak_fp32_tflops)


def feasible(config: WgmmaConfig, gpu: GpuSpec) -> str | None:
    if gpu.arch is not Arch.SM90:
        return f"wgmma (sm_90a) cannot run on {gpu.name} ({gpu.arch.value})"
    return tc.refusal(config, gpu)


def stage_mma_cycles(config: WgmmaConfig, gpu: GpuSpec) -> float:
    """Cycles of one SM's tensor cores for one stage of a block."""
    return tc.mma_cycles(config, gpu, tensor_tflops(gpu))


@functools.lru_cache(maxsize=4096)
def stage_time(config: WgmmaConfig, gpu: GpuSpec) -> WgmmaStage:
    c = config
    return WgmmaStage(copy=c.a_tile_bytes / A_COPY_BYTES_PER_CYCLE,
                      tensor=stage_mma_cycles(c, gpu),
                      issue=COPY_ISSUE_CYCLES * (c.a_per_thread + c.b_per_thread),
                      ahead=c.stages - 2, specialized=c.specialized,
                      per_sm=max(1, tc.blocks_per_sm(c, gpu)))


def estimate(config: WgmmaConfig, gpu: GpuSpec, rows: int, cols: int, depth: int
             ) -> Estimate:
    modelled = config.ws_twin()  # producer "tma": its _ws twin's numbers
    return tc.estimate(modelled, gpu, stage_time(modelled, gpu), rows, cols, depth)


def estimate_ms(config: WgmmaConfig, gpu: GpuSpec, shape: Shape) -> float:
    return estimate(config, gpu, *shape).time_ms


def rank_table(configs: Sequence[WgmmaConfig], gpu: GpuSpec) -> RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""
    return RankTable(list(configs), gpu, feasible, estimate)
