"""A Llama-architecture decoder, dense BF16 against nmgen's N:M sparse projections.

The model is built from a ``transformers`` configuration alone (random weights, nothing
downloaded): Llama-2-7B layer sizes (hidden 4096, intermediate 11008, 32 heads, vocabulary
32000), ``--layers`` decoder layers (8 by default), bfloat16. For each variant, the same
dense weights with the attention and MLP projections

- left dense (the baseline),
- pruned by ``nmgen.nn.sparsify`` to each ``--patterns`` pattern with ``L = --vec``,
  with its sibling projections fused (``... fused``: q/k/v and gate/up each one product,
  ``nmgen.nn.fuse_siblings``) with ``--fuse only``, both ways with ``--fuse both``,
- pruned to 2:4 by magnitude and handed to PyTorch's semi-structured sparse tensors
  (``torch.sparse.to_sparse_semi_structured``; skipped with ``--no-semi24``),

and in each ``--modes`` mode (``reduce-overhead``: ``torch.compile`` with CUDA graphs; also
``default`` and ``eager``), with a static KV cache, it measures

- prefill: one forward of ``--prefill`` tokens (batch 1), median of ``--repeats`` runs;
- decode: tokens/s at each ``--batches`` batch size = batch × ``--steps`` steps after
  ``--warmup`` steps, over their wall time (context ``--context`` tokens, greedy);
- for each sparse variant, the largest logit difference from the same pruned weights run
  densely (``nn.Linear``, eager, ``--check-tokens`` tokens); it passes within
  ``LOGIT_TOL`` × the largest reference logit.

Every variant is measured in the same process against the same dense baseline. A failure
(a compile error, CUDA graphs skipped under ``reduce-overhead``) is recorded in its row,
never replaced by a fallback. Writes ``results.json`` and ``results.md`` to ``--out``.

    python examples/llama.py --out DIR                 # from a checkout: PYTHONPATH=. first
    python examples/llama.py --quick --out DIR         # a tiny configuration, 2 layers
"""

from __future__ import annotations

import argparse
import copy
import gc
import inspect
import json
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import nmgen
import nmgen.nn as nmnn

# Projections sparsified: attention (q, k, v, o) and MLP (gate, up, down); not lm_head.
TARGETS = ["*.self_attn.*_proj", "*.mlp.*_proj"]
# bfloat16 keeps 8 significant bits: every projection's output, residual sum and
# normalisation rounds at 2**-9 relative, in the sparse model and in its dense reference
# alike but not at the same values (nmgen sums in FP32 in its own order, then rounds), and
# the differences grow through the layers. Two layers of this model on the CPU (nmgen's
# float32 reference path against dense bf16 matmuls) differ by 0.65 % of the largest
# logit; 5 % leaves room for 8 layers and still flags a wrong product, which moves the
# logits by their own size.
LOGIT_TOL = 0.05
# --fuse: the name suffixes of each pattern's variants (unfused, fused)
FUSE_CHOICES = {"none": [""], "only": [" fused"], "both": ["", " fused"]}


@dataclass
class Row:
    """One variant in one mode."""

    variant: str
    mode: str
    sparsity: float = 0.0
    prefill_ms: float | None = None
    decode_tokens_s: dict[int, float] = field(default_factory=dict)
    speedup_prefill: float | None = None
    speedup_decode: dict[int, float] = field(default_factory=dict)
    max_logit_diff: float | None = None
    max_ref_logit: float | None = None
    logits_within_tol: bool | None = None
    params_before: int | None = None
    params_after: int | None = None
    bytes_saved: int | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    # GPU time of one batch-1 decode step by kernel kind (µs), with --profile-steps
    decode_step_us: dict[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------------ the model
def llama_config(args: argparse.Namespace) -> Any:
    from transformers import LlamaConfig

    if args.quick:
        sizes = dict(hidden_size=256, intermediate_size=688, num_attention_heads=4,
                     num_key_value_heads=4, vocab_size=1000)
    else:  # Llama-2-7B
        sizes = dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000)
    config = LlamaConfig(num_hidden_layers=args.layers, max_position_embeddings=4096,
                         tie_word_embeddings=False, **sizes)
    config._attn_implementation = "sdpa"
    return config


def build_model(config: Any, device: torch.device, seed: int) -> nn.Module:
    """Random weights (the configuration's initialisation), bfloat16, on ``device``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with device:
        model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16).eval().requires_grad_(False)


@dataclass(frozen=True)
class Calls:
    """How this ``transformers`` version's forward takes the cache and positions."""

    cache_kw: str
    cache_position: bool
    logits_kw: str | None

    @classmethod
    def of(cls, model: nn.Module) -> Calls:
        params = inspect.signature(model.forward).parameters
        logits = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params),
                      None)
        return cls("cache" if "cache" in params else "past_key_values",
                   "cache_position" in params, logits)

    def logits(self, fn: Any, ids: torch.Tensor, positions: torch.Tensor,
               cache: Any) -> torch.Tensor:
        """The last position's logits of ``fn`` (the model, compiled or not) on ``ids``
        at ``positions`` (``1×T``), writing the static ``cache``."""
        kwargs: dict[str, Any] = {self.cache_kw: cache, "use_cache": True,
                                  "position_ids": positions.expand(ids.shape[0], -1)}
        if self.cache_position:
            kwargs["cache_position"] = positions[0]
        if self.logits_kw:
            kwargs[self.logits_kw] = 1
        return fn(input_ids=ids, **kwargs).logits[:, -1:]


def static_cache(model: nn.Module, batch: int, length: int) -> Any:
    """A ``StaticCache`` of ``length`` positions, in the arguments this version takes."""
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kwargs: dict[str, Any] = {"config": model.config, "max_cache_len": length}
    extra = {"max_batch_size": batch, "batch_size": batch, "device": model.device,
             "dtype": torch.bfloat16}
    kwargs.update({k: v for k, v in extra.items() if k in params})
    return StaticCache(**kwargs)


# ------------------------------------------------------------------------ variants
def sparsify_nmgen(model: nn.Module, pattern: str, vec: int,
                   fuse: bool = False) -> nmnn.SparsifySummary:
    # transformers' Llama attention and MLP hand their input to q/k/v and gate/up as is,
    # so the siblings may share one product by its identity under torch.compile
    summary = nmnn.sparsify(model, pattern, vec, include=TARGETS,
                            siblings=nmnn.LLAMA_SIBLINGS if fuse else None,
                            compiled_inputs_unchanged=True)
    if summary.skipped:
        raise RuntimeError(f"layers skipped:\n{summary}")
    return summary


def prune_2to4(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (out×in) with the 2 largest magnitudes of every 4 inputs kept."""
    groups = weight.reshape(weight.shape[0], -1, 4)
    keep = groups.abs().float().topk(2, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return (groups * mask).reshape(weight.shape)


def targets(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    import fnmatch

    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)
            and any(fnmatch.fnmatchcase(name, g) for g in TARGETS)]


def semi_structured(model: nn.Module) -> None:
    """Every target projection's weight as a 2:4 semi-structured sparse tensor (the
    weights are pruned to 2:4 beforehand)."""
    from torch.sparse import to_sparse_semi_structured

    for _, linear in targets(model):
        linear.weight = nn.Parameter(to_sparse_semi_structured(linear.weight),
                                     requires_grad=False)


def densify(model: nn.Module) -> None:
    """Every ``SparseLinear`` (and fused sibling) replaced by the ``nn.Linear`` of its
    pruned weight."""
    for name, module in list(model.named_modules()):
        if isinstance(module, nmnn.FusedSlice) or (
                isinstance(module, nmnn.SparseLinear)
                and not isinstance(module, nmnn.FusedLinear)):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, module.to_linear())


# ------------------------------------------------------------------------ measuring
def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def compiled(model: nn.Module, mode: str, fullgraph: bool) -> Any:
    if mode == "eager":
        return model
    return torch.compile(model, mode=None if mode == "default" else mode,
                         fullgraph=fullgraph, dynamic=False)


def prefill_ms(fn: Any, model: nn.Module, calls: Calls, args: argparse.Namespace,
               vocab: int) -> float:
    """Median time of one forward of ``--prefill`` tokens at batch 1 into a reset cache."""
    tokens = args.prefill
    ids = torch.randint(vocab, (1, tokens), device=model.device)
    positions = torch.arange(tokens, device=model.device)[None]
    cache = static_cache(model, 1, tokens)
    calls.logits(model, ids, positions, cache)  # eager: the cache lays itself out
    times = []
    for i in range(args.repeats + 2):
        cache.reset()
        torch.compiler.cudagraph_mark_step_begin()
        sync()
        start = time.perf_counter()
        calls.logits(fn, ids, positions, cache)
        sync()
        if i >= 2:  # the first two compile, warm up and record the graph
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def decode_tokens_s(fn: Any, model: nn.Module, calls: Calls, args: argparse.Namespace,
                    batch: int, vocab: int, row: Row | None = None) -> float:
    """Greedy decode at ``batch``: batch × steps after warm-up over their wall time. With
    ``--profile-steps`` at batch 1, that many more steps are profiled into ``row``."""
    profiled = args.profile_steps if row is not None and batch == 1 else 0
    length = args.context + args.warmup + args.steps + profiled
    positions = torch.arange(length, device=model.device)[None]
    cache = static_cache(model, batch, length)
    ids = torch.randint(vocab, (batch, args.context), device=model.device)
    token = calls.logits(model, ids, positions[:, :args.context], cache).argmax(-1)
    at = args.context

    def step() -> None:
        nonlocal token, at
        torch.compiler.cudagraph_mark_step_begin()
        token = calls.logits(fn, token, positions[:, at:at + 1], cache).argmax(-1)
        at += 1

    for _ in range(args.warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    tokens_s = batch * args.steps / (time.perf_counter() - start)
    if profiled:
        row.decode_step_us = profile_steps(step, profiled)
    return tokens_s


def kernel_kind(name: str) -> str:
    """The kind of a CUDA kernel by its name: nmgen's, a dense GEMM, attention, the rest."""
    lowered = name.lower()
    if lowered.startswith(("nm_", "nmgen::")):
        return "nmgen"
    if any(tag in lowered for tag in ("gemm", "nvjet", "cutlass", "xmma", "gemv", "cublas")):
        return "dense GEMM"
    if any(tag in lowered for tag in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    return "other"


def profile_steps(step: Any, count: int) -> dict[str, float]:
    """GPU time per decode step by kernel kind (µs), from ``torch.profiler`` over
    ``count`` steps; ``total`` is their sum, ``kernels`` the kernels a step launches.
    Without CUDA (a smoke test) the same of the CPU's top-level ops."""
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        for _ in range(count):
            step()
        sync()
    out: dict[str, float] = {}
    launches = 0
    for event in prof.key_averages():
        if gpu:
            us = getattr(event, "self_device_time_total", None)
            if us is None:  # an older torch
                us = getattr(event, "self_cuda_time_total", 0.0)
        else:
            us = event.self_cpu_time_total if event.key.startswith(("aten::", "nmgen::")) else 0
        if us <= 0:
            continue
        kind = kernel_kind(event.key)
        out[kind] = out.get(kind, 0.0) + us / count
        launches += event.count
    out = {kind: round(us, 1) for kind, us in sorted(out.items())}
    out["total"] = round(sum(out.values()), 1)
    out["kernels"] = round(launches / count, 1)
    return out


def measure(row: Row, model: nn.Module, calls: Calls, args: argparse.Namespace,
            vocab: int) -> None:
    """Prefill and decode of ``model`` in ``row.mode``; a failure goes into the row."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        fn = compiled(model, row.mode, args.fullgraph)
        row.prefill_ms = prefill_ms(fn, model, calls, args, vocab)
        for batch in args.batches:
            row.decode_tokens_s[batch] = decode_tokens_s(fn, model, calls, args, batch,
                                                         vocab, row)
    except Exception as exc:  # recorded in the results, with its traceback on stderr
        traceback.print_exc()
        row.error = f"{type(exc).__name__}: {exc}"[:2000]
    skips = counters["inductor"]["cudagraph_skips"]
    if row.mode == "reduce-overhead" and skips:
        row.error = (row.error or "") + (
            f" CUDA graphs were skipped {skips} time(s) under reduce-overhead (the times "
            "are not of graphs; TORCH_LOGS=perf_hints says why)")
    torch._dynamo.reset()


def plain_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, use_cache=False).logits.float()


# ------------------------------------------------------------------------ the run
def make_variant(name: str, dense: nn.Module, args: argparse.Namespace,
                 check_ids: torch.Tensor) -> tuple[nn.Module, dict[str, Any],
                                                   torch.Tensor | None]:
    """A copy of the dense model made ``name``, what its rows record of it, and for the
    2:4 variant the logits of its pruned weights run densely (taken before conversion)."""
    model = copy.deepcopy(dense)
    if name.startswith("nmgen"):
        pattern = name.split()[1]
        summary = sparsify_nmgen(model, pattern, args.vec, fuse=name.endswith(" fused"))
        # a group left apart (--quick: intermediate 688 is no multiple of L = 128, so
        # gate/up do not fuse) is said in the row, not an error
        notes = [f"{len(summary.fused_groups)} sibling groups fused"] if summary.fused_groups \
            else []
        notes += [f"not fused: {nmnn.fuse.group_label(g.parent, g.names)}: {g.reason}"
                  for g in summary.unfused_groups]
        return model, {"sparsity": nmgen.Pattern.parse(pattern).sparsity,
                       "params_before": summary.params_before,
                       "params_after": summary.params_after,
                       "bytes_saved": summary.bytes_saved, "notes": notes}, None
    if name.startswith("torch 2:4"):
        with torch.no_grad():
            for _, linear in targets(model):
                linear.weight.copy_(prune_2to4(linear.weight))
        reference = plain_logits(model, check_ids)
        semi_structured(model)
        return model, {"sparsity": 0.5}, reference
    return model, {}, None


def check_logits(rows: list[Row], model: nn.Module, check_ids: torch.Tensor,
                 reference: torch.Tensor | None) -> None:
    """The largest logit difference from the same pruned weights run densely (eager, no
    cache); an nmgen model is densified for its reference, after it ran."""
    logits = plain_logits(model, check_ids)
    if reference is None:
        densify(model)
        reference = plain_logits(model, check_ids)
    diff, peak = float((logits - reference).abs().max()), float(reference.abs().max())
    for row in rows:
        row.max_logit_diff, row.max_ref_logit = diff, peak
        row.logits_within_tol = diff <= LOGIT_TOL * peak


def run_variant(name: str, dense: nn.Module, args: argparse.Namespace, vocab: int,
                check_ids: torch.Tensor) -> list[Row]:
    """Every mode of one variant; a failure goes into its rows."""
    rows = [Row(name, mode) for mode in args.modes]
    try:
        model, facts, reference = make_variant(name, dense, args, check_ids)
    except Exception as exc:
        traceback.print_exc()
        for row in rows:
            row.error = f"{type(exc).__name__}: {exc}"[:2000]
        return rows
    for row in rows:
        for key, value in facts.items():
            setattr(row, key, list(value) if isinstance(value, list) else value)
        print(f"-- {name}, {row.mode}", file=sys.stderr, flush=True)
        measure(row, model, Calls.of(model), args, vocab)
    if name != "dense":
        try:
            check_logits(rows, model, check_ids, reference)
        except Exception as exc:
            traceback.print_exc()
            for row in rows:
                row.notes.append(f"logit check failed: {type(exc).__name__}: {exc}")
    del model
    free_memory()
    return rows


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    except ImportError:
        pass


def speedups(rows: list[Row]) -> None:
    base = {r.mode: r for r in rows if r.variant == "dense" and not r.error}
    for row in rows:
        dense = base.get(row.mode)
        if dense is None or row.error:
            continue
        if row.prefill_ms and dense.prefill_ms:
            row.speedup_prefill = dense.prefill_ms / row.prefill_ms
        row.speedup_decode = {b: t / dense.decode_tokens_s[b]
                              for b, t in row.decode_tokens_s.items()
                              if dense.decode_tokens_s.get(b)}


def markdown(rows: list[Row], env: dict[str, Any], args: argparse.Namespace) -> str:
    batches = args.batches
    head = (["variant", "mode", f"prefill ms ({args.prefill} tok)", "× dense"]
            + [c for b in batches for c in (f"decode tok/s b={b}", "× dense")]
            + ["max |Δlogit| / max |logit|", "note"])
    lines = [f"Llama decoder (hidden {env['hidden']}, intermediate {env['intermediate']}, "
             f"{env['heads']} heads, {env['layers']} layers), bf16, {env['gpu']}, "
             f"torch {env['torch']}, transformers {env['transformers']}; decode: "
             f"{args.steps} steps after {args.warmup}, context {args.context}; logit "
             f"tolerance {LOGIT_TOL:.0%} of the largest reference logit", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]

    def num(value: float | None, fmt: str) -> str:
        return "" if value is None else format(value, fmt)

    for r in rows:
        cells = [r.variant, r.mode, num(r.prefill_ms, ".1f"), num(r.speedup_prefill, ".2f")]
        for b in batches:
            cells += [num(r.decode_tokens_s.get(b), ".1f"),
                      num(r.speedup_decode.get(b), ".2f")]
        check = ("" if r.max_logit_diff is None else
                 f"{r.max_logit_diff:.3g} / {r.max_ref_logit:.3g} "
                 f"({'ok' if r.logits_within_tol else 'OVER'})")
        note = "; ".join(([f"error: {r.error}"] if r.error else []) + r.notes)
        cells += [check, note.replace("|", "/").replace("\n", " ")[:300]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + profile_table(rows)) + "\n"


def profile_table(rows: list[Row]) -> list[str]:
    """GPU time of one batch-1 decode step by kernel kind, where it was profiled."""
    profiled = [r for r in rows if r.decode_step_us]
    if not profiled:
        return []
    kinds = sorted({k for r in profiled for k in r.decode_step_us} - {"total", "kernels"})
    head = ["variant", "mode"] + [f"{k} µs" for k in kinds] + ["step µs (GPU)", "kernels"]
    lines = ["", "GPU time of one decode step at batch 1 (torch.profiler):", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in profiled:
        us = r.decode_step_us
        cells = [r.variant, r.mode] + [format(us.get(k, 0.0), ".1f") for k in kinds]
        lines.append("| " + " | ".join(cells + [format(us["total"], ".1f"),
                                                  format(us["kernels"], ".0f")]) + " |")
    return lines


def environment(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    import transformers

    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
            "nmgen": nmgen.__version__, "layers": config.num_hidden_layers,
            "hidden": config.hidden_size, "intermediate": config.intermediate_size,
            "heads": config.num_attention_heads, "vocab": config.vocab_size,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for results.json/.md")
    p.add_argument("--layers", type=int, default=8, help="decoder layers (default 8)")
    p.add_argument("--patterns", default="16:32,8:32,4:32", help="nmgen patterns")
    p.add_argument("--vec", type=int, default=128, help="nmgen vector length L")
    p.add_argument("--fuse", choices=FUSE_CHOICES, default="none",
                   help="run each nmgen pattern with q/k/v and gate/up fused (variants named "
                        "'... fused'): none, only, or both ways (default: none)")
    p.add_argument("--no-semi24", dest="semi24", action="store_false",
                   help="leave out PyTorch's 2:4 semi-structured variant")
    p.add_argument("--modes", default="reduce-overhead",
                   help="comma list of reduce-overhead, default, eager")
    p.add_argument("--no-fullgraph", dest="fullgraph", action="store_false",
                   help="let torch.compile break graphs (default: fullgraph=True)")
    p.add_argument("--batches", default="1,8", help="decode batch sizes")
    p.add_argument("--prefill", type=int, default=2048, help="prefill tokens")
    p.add_argument("--context", type=int, default=128, help="decode context tokens")
    p.add_argument("--warmup", type=int, default=8, help="decode steps before timing")
    p.add_argument("--steps", type=int, default=128, help="decode steps timed")
    p.add_argument("--repeats", type=int, default=10, help="prefill runs timed")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="profile this many batch-1 decode steps after the timed ones: GPU "
                        "time a step by kernel kind in results.json (default: none)")
    p.add_argument("--check-tokens", type=int, default=64, help="tokens of the logit check")
    p.add_argument("--quick", action="store_true", help="a tiny configuration, 2 layers")
    p.add_argument("--device", default="cuda", help="cuda (cpu: a smoke test, eager)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(args.modes) - {"reduce-overhead", "default", "eager"}
    if unknown:
        p.error(f"unknown modes {sorted(unknown)}")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.patterns = [s.strip() for s in args.patterns.split(",") if s.strip()]
    if args.quick:
        args.layers = min(args.layers, 2)
        args.prefill, args.context, args.warmup, args.steps, args.repeats = 128, 16, 2, 8, 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    device = torch.device(args.device)
    config = llama_config(args)
    env = environment(args, config)
    variants = (["dense"] + [f"nmgen {p} L={args.vec}{fused}" for p in args.patterns
                             for fused in FUSE_CHOICES[args.fuse]]
                + (["torch 2:4 semi-structured"] if args.semi24 and device.type == "cuda"
                   else []))
    print(f"{env['gpu']}: {', '.join(variants)}; modes {', '.join(args.modes)}",
          file=sys.stderr)
    rows: list[Row] = []
    with torch.no_grad():  # not inference_mode: copies and conversions stay plain tensors
        dense = build_model(config, device, args.seed)
        check_ids = torch.randint(config.vocab_size, (1, args.check_tokens), device=device)
        for name in variants:
            rows += run_variant(name, dense, args, config.vocab_size, check_ids)
    speedups(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"environment": env, "logit_tolerance": LOGIT_TOL,
              "dispatch_stats": nmgen.dispatch_stats(),
              "settings": {k: (str(v) if isinstance(v, Path) else v)
                           for k, v in vars(args).items()},
              "rows": [asdict(r) for r in rows]}
    (args.out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    table = markdown(rows, env, args)
    (args.out / "results.md").write_text(table)
    print(table)
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
