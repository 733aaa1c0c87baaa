"""One family convention: a built-in family is a folder of conventionally named modules
that ``ModularFamily`` finds, so that its ``family.py`` states only what is its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmgen.families import registry
from nmgen.families.base import EPILOGUE_TEMPLATE, ModularFamily, enumeration, rank_table
from nmgen.gpus import gpu_spec
from nmgen.problem import Problem

PACKAGE = Path(registry.__file__).resolve().parent
BUILT_IN = ("f32", "gemv", "mma", "wgmma", "sptc", "mmasp")


@pytest.mark.parametrize("folder", ["f32_simt", "gemv"])
def test_a_family_module_holds_only_what_is_its_own(folder):
    assert len((PACKAGE / folder / "family.py").read_text().splitlines()) <= 80


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_built_in_families_follow_the_convention(name):
    family = registry.get(name)
    assert isinstance(family, ModularFamily)
    for module in ("model", "render", "prepare", "launch", "config", "space"):
        assert family.module(module).__name__.endswith(f".{module}")
    files = family.generator_files()
    assert files[0].parent == family.folder / "templates" and files[1] == EPILOGUE_TEMPLATE
    assert files[-1] == family.folder / "render.py"


def test_a_module_a_family_lacks_comes_from_its_base_package():
    mma = registry.get("mma")
    assert mma.module("launch").__name__ == "nmgen.families.tensor_core.launch"
    assert mma.module("model").__name__ == "nmgen.families.mma.model"


def test_one_rank_table_serves_the_untuned_choice_and_the_seeds():
    """The untuned choice ranks the family's own candidates with the same table builder
    as the seeds: the FP32 family's, of the A tile its untuned choice takes."""
    f32, gpu, problem = registry.get("f32"), gpu_spec("h100"), Problem(2, 4, 16)
    seeds = rank_table(f32, problem, gpu, f32.space)
    untuned = rank_table(f32, problem, gpu, f32.space, "default_candidates")
    assert untuned is not seeds
    assert {c.a_tile for c in untuned.configs} == {"tm"}
    assert set(untuned.configs) <= set(enumeration(f32, problem, f32.space))
    best = untuned.rank(256, 512, 512)[0][1]
    assert f32.default_config(problem, gpu, (256, 512, 512)) == best
