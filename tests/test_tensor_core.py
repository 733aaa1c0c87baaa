"""What the two tensor-core families (``mma``, ``wgmma``) make of their configurations:
names, JSON, rule refusals, rendered source (and the generator hash tuned records are keyed
on), model estimates and ranking, the prepared weight and the launch plans, as digests of a
fixed sample of each family's enumerations (``PINNED``). Code the families share or move
keeps every digest.

A change that means to alter one of these re-pins it: ``python3 tests/test_tensor_core.py``
prints the current digests."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import nmgen
from nmgen.codegen import source_hash
from nmgen.families.base import Family
from nmgen.families.mma import MMA
from nmgen.families.plan import Call, Device
from nmgen.families.registry import all_families
from nmgen.families.tensor_core import SOURCES
from nmgen.families.wgmma import WGMMA
from nmgen.gpus import Arch, gpu_spec
from nmgen.problem import ALayout, Problem
from nmgen.runtime.check import random_weight

KM, RM = ALayout.K_MAJOR, ALayout.ROW_MAJOR
PROBLEMS = {
    "mma": [Problem(8, 32, 128, RM, dtype="bf16"), Problem(16, 32, 64, KM, Arch.SM80, "f16"),
            Problem(2, 4, 16, RM, Arch.SM86, "f16"), Problem(3, 7, 32, KM, dtype="bf16")],
    "wgmma": [Problem(8, 32, 128, KM, dtype="bf16"), Problem(2, 4, 64, KM, dtype="f16"),
              Problem(16, 64, 256, KM, dtype="bf16"), Problem(3, 7, 64, KM, dtype="f16")],
}
FAMILIES = {"mma": MMA, "wgmma": WGMMA}
GPUS = [gpu_spec(name) for name in ("h100", "h200", "a100", "l4")]
SHAPES = [(1, 4096, 4096), (128, 11008, 4096), (4096, 4096, 14336), (37, 200, 300)]
EPILOGUES = ["bias", "bias_silu"]
STRIDES = {"mma": 29, "wgmma": 7}  # every so many configurations of an enumeration
DEVICE = Device(132, lambda entry, threads, smem: 1)


def sample(family: Family, stride: int | None = None) -> list:
    """Every ``stride``-th configuration of each problem's enumeration, and the first of
    each with every epilogue."""
    stride = stride or STRIDES[family.name]
    configs = []
    for problem in PROBLEMS[family.name]:
        enumerated = family.seed_candidates(problem, family.space)
        configs += enumerated[::stride]
        configs += [enumerated[0].replace(epilogue=tag) for tag in EPILOGUES]
    return configs


def refusals(family: Family, limit: int = 400) -> Iterator[str]:
    """The rule each of the first ``limit`` invalid grid points of each problem breaks."""
    for problem in PROBLEMS[family.name]:
        found = 0
        for values in family.space.grid(problem):
            try:
                family.space.mapping.build(problem, values)
            except nmgen.ConfigError as error:
                found += 1
                yield str(error)
            if found == limit:
                break


def describe_configs(family: Family, configs: list) -> Iterator[str]:
    for c in configs:
        yield (f"{c.name} {c.to_json()} {c.threads} {c.smem_bytes} {c.accumulators} "
               f"{c.registers_estimate} {family.template_arguments(c)} "
               f"{family.entry_points(c)} {family.compile_target(c)} "
               f"{family.layout_key(c)} {family.seed_shape(c)} "
               f"{family.config_from_name(c.name) == c}")
    yield from refusals(family)
    for problem in PROBLEMS["mma"] + PROBLEMS["wgmma"]:
        yield f"{problem} {family.serves(problem)}"


def describe_sources(family: Family, configs: list) -> Iterator[str]:
    yield family.generator_hash()  # what tuned records are keyed on
    for c in configs:
        yield f"{c.name} {source_hash(nmgen.render(c).code)}"


def describe_model(family: Family, configs: list) -> Iterator[str]:
    for gpu in GPUS:
        for c in configs:
            yield f"{gpu.name} {c.name} {family.feasible(c, gpu)}"
            yield from (repr(family.estimate_ms(c, gpu, s)) for s in SHAPES)
        ranker = family.ranker(configs, gpu)
        for shape in SHAPES:
            yield repr([(t, c.name) for t, c in ranker.rank(*shape)[:5]])


def describe_weight(family: Family, configs: list) -> Iterator[str]:
    for c in configs[::3]:
        for depth, cols in ((300, 130), (64, 256)):
            rng = np.random.default_rng(depth)
            weight = random_weight(rng, c.n, c.m, c.vec, depth, cols, dtype=c.dtype)
            prepared = family.prepare(weight, c)
            yield f"{c.name} {prepared.key}"
            for key, array in sorted(prepared.arrays.items()):
                yield f"{key} {array.shape} {array.dtype} {hashlib.sha256(array).hexdigest()}"
            for call in (Call(100, depth, True), Call(7, depth + 1, True), Call(64, 304, False)):
                yield repr(family.plan(c, prepared, weight.shape, call, DEVICE))


ASPECTS: dict[str, Callable[[Family, list], Iterator[str]]] = {
    "configs": describe_configs, "sources": describe_sources, "model": describe_model,
    "weight": describe_weight}


def digest(family: Family, aspect: str) -> str:
    lines = ASPECTS[aspect](family, sample(family))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


PINNED = {
    ("mma", "configs"):
        "dd53d263f3d4236f805d6b1a0b1f47ac7eb4c9f839891bc9435c07e1854e44f2",
    ("mma", "model"):
        "53ff862ed48a80a763a5cff832ecd6bddd1ee1c1a3446330f1cf5d0884aebc14",
    ("mma", "sources"):
        "abee781adff20f844541d35c67328208f94beaa0a7892c2d9fd9fa0e7b9a2986",
    ("mma", "weight"):
        "596111e9f03e4bae9b5df55b02ee9691a25fb9ac5752d0a0ad9995c9b7b0ca63",
    ("wgmma", "configs"):
        "a72f7fa6fe7cb47ef79b0d029e5e79189c111ee445cdb87aa66aebd2c6c4aaad",
    ("wgmma", "model"):
        "4d104fe14cf5bb5412c53f44a3666284eca7a1d27d75a9a22eb6137f9fff732e",
    ("wgmma", "sources"):
        "0cf3cf002c0e4dd8d42b2d5cb7fd51bfcd8b182aaa63efb32fca720eac78703c",
    ("wgmma", "weight"):
        "166cad218952c03e553995519f52f99db7976bf909f6777b4f220a89700b84e4",
}


@pytest.mark.parametrize("aspect", sorted(ASPECTS))
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_makes_what_it_made_of_its_configurations(name, aspect):
    assert digest(FAMILIES[name], aspect) == PINNED[name, aspect]


def test_the_shared_package_is_no_family_and_counts_among_both_families_sources():
    assert {f.name for f in all_families()} >= set(FAMILIES)
    assert not any(f.templates.parent.name == "tensor_core" for f in all_families())
    for family in FAMILIES.values():
        assert set(SOURCES) <= set(family.source_files())
        assert family.templates.parent.name == family.name


if __name__ == "__main__":
    for name, family in sorted(FAMILIES.items()):
        for aspect in sorted(ASPECTS):
            print(f'    ("{name}", "{aspect}"):\n        "{digest(family, aspect)}",')
