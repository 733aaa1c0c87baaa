"""Rendering: every sampled valid configuration renders; the source states what it is;
every configuration of the shipped database renders the source its records timed."""

from __future__ import annotations

import json
import random

import pytest

import nmgen
from nmgen.families.f32_simt.space import SPACE
from nmgen.gpus import Arch
from nmgen.problem import ALayout, Problem

PATTERNS = [(2, 4), (1, 4), (2, 8), (4, 8), (4, 16), (8, 16), (16, 32), (12, 32), (8, 32),
            (4, 32), (16, 64), (3, 7)]


def sampled_configs(count: int, seed: int) -> list[nmgen.KernelConfig]:
    rng = random.Random(seed)
    configs = []
    while len(configs) < count:
        problem = Problem(*rng.choice(PATTERNS), rng.choice([1, 4, 8, 16, 32, 64, 128]),
                          a_layout=rng.choice(list(ALayout)), arch=rng.choice(list(Arch)))
        configs.append(SPACE.sample(problem, rng))
    return configs


def test_renders_120_sampled_configurations():
    for config in sampled_configs(120, seed=random.randrange(1 << 30)):
        code = nmgen.render(config).code
        assert code.startswith("// ---")
        assert f"// {config.name}\n" in code
        assert f"nmgen {nmgen.__version__}" in code
        assert 'extern "C" __global__ void __launch_bounds__' in code
        assert f"{config.name}(" in code
        assert ("_reduce(" in code) == (config.split_k > 1)
        assert ("_transpose(" in code) == config.a_copied
        # sm_90's main kernel after A's copy waits for it (a programmatic dependent launch)
        assert ("griddepcontrol.wait" in code) == (config.a_copied
                                                   and config.arch.number >= 90)
        assert "{{" not in code and "{%" not in code


def test_header_lists_the_configuration():
    config = nmgen.KernelConfig(2, 4, 8, 64, 64, 16, 4, 4, packing=True, stages=3)
    code = nmgen.render(config).code
    for key, value in config.to_dict().items():
        assert f"//   {key:<9} = {value}" in code


def test_render_is_deterministic():
    config = nmgen.KernelConfig(8, 32, 32, 128, 128, 64, 8, 8)
    assert nmgen.render(config).code == nmgen.render(config.replace()).code


@pytest.mark.parametrize("layout", list(ALayout))
def test_layout_selects_the_loader(layout):
    code = nmgen.render(nmgen.KernelConfig(2, 4, 8, 64, 64, 16, 4, 4, a_layout=layout)).code
    assert f"A_ROW_MAJOR = {'true' if layout is ALayout.ROW_MAJOR else 'false'}" in code


def test_copied_a_runs_the_k_major_kernel_after_a_transpose():
    copied = nmgen.KernelConfig(16, 32, 32, 128, 256, 64, 16, 8, a_tile="tx")
    k_major = copied.replace(a_layout="km", a_tile="tk")
    code, k_code = nmgen.render(copied).code, nmgen.render(k_major).code
    assert nmgen.render(copied).entry_points == (copied.name, f"{copied.name}_transpose")
    main, transpose = code.split("// Row-major A (M x K, lda) copied K-major")
    # The main kernel is the K-major one, line for line, but for its name and header and,
    # on sm_90, its wait for the copy at its top.
    body = main[main.index("namespace {"):].replace(copied.name, k_major.name)
    assert copied.arch.number >= 90 and body.count("    WAIT_FOR_COPY();\n") == 1
    body = body.replace("    WAIT_FOR_COPY();\n", "")
    assert body.rstrip() == k_code[k_code.index("namespace {"):].rstrip()
    assert f"{copied.name}_transpose(const float* __restrict__ A" in transpose
    # Its block size and tile come from the family's render module, which its launch plan
    # reads too.
    from nmgen.families.f32_simt.render import COPY_A_THREADS, COPY_A_TILE

    assert f"__launch_bounds__({COPY_A_THREADS})" in transpose
    assert f"COPY_TILE = {COPY_A_TILE}," in transpose
    assert f"THREADS_ = {COPY_A_THREADS};" in transpose


def test_sliced_k_kernel_splits_the_rows_and_adds_the_slices():
    plain = nmgen.KernelConfig(8, 32, 32, 64, 128, 128, 8, 8, a_layout="km")
    sliced = plain.replace(slice_k=4)
    code = nmgen.render(sliced).code
    assert "constexpr int SLICE_K = 4;" in code and "SLICE_ROWS = WS / SLICE_K" in code
    assert "#pragma unroll 8\n    for (int r = 0; r < SLICE_ROWS; ++r)" in code  # 32 rows / 4
    assert "if (slice != 0) return;" in code
    assert "SLICE" not in nmgen.render(plain).code  # unsliced kernels carry none of it


@pytest.mark.parametrize(("a_tile", "ws", "unroll"), [
    ("tm", 8, 8), ("tm", 32, 16), ("tr", 32, 16), ("tk", 24, 16)])
def test_row_loop_unroll(a_tile, ws, unroll):
    # 8:32 with KS = 4 * ws: ws compressed rows a stage.
    config = nmgen.KernelConfig(8, 32, 32, 128, 128, 4 * ws, 8, 8, a_tile=a_tile)
    assert config.ws == ws
    code = nmgen.render(config).code
    assert f"#pragma unroll {unroll}\n    for (int w = 0; w < WS; ++w)" in code


@pytest.mark.parametrize(("pattern", "ks", "trips", "unroll"), [
    ((16, 32), 64, [8, 8], 8),      # B' 32 rows, 4 a step; A 64 rows, 8 a step
    ((12, 32), 128, [12, 16], 16),  # B' 48 rows: 12 steps, not a multiple of 8
    ((8, 32), 128, [8, 16], 8)])
def test_copy_loops_unrolled_whole_where_8_leaves_a_remainder(pattern, ks, trips, unroll):
    """The core kernels' stage copies (256 threads, NS = 256: 64 chunks a B' row)."""
    from nmgen.families.f32_simt.render import copy_trip_counts, copy_unroll

    config = nmgen.KernelConfig(*pattern, 32, 128, 256, ks, 16, 8, a_layout="km")
    assert (copy_trip_counts(config), copy_unroll(config)) == (trips, unroll)
    code = nmgen.render(config).code
    assert code.count(f"#pragma unroll {unroll}\n        for (int j = 0; j < STEPS; ++j") == 2


@pytest.mark.parametrize(("tile", "serpentine"), [
    ((64, 128, 8, 8), True), ((128, 256, 16, 8), False), ((64, 512, 8, 16), False)])
def test_serpentine_ffma_order_only_on_8x8_thread_tiles(tile, serpentine):
    """Odd rows walk their columns backwards on 8x8 thread tiles only (measured faster
    there, slower on 16x8: render.serpentine_ffma). tile: MS, NS, MT, NT."""
    ms, ns, mt, nt = tile
    code = nmgen.render(nmgen.KernelConfig(8, 32, 32, ms, ns, 64, mt, nt, a_layout="km")).code
    assert ("(i & 1) ? NT_GROUP - 1 - jj : jj" in code) is serpentine
    assert code.count("fmaf(a[i], b[g * NT_GROUP + j]") == 1


def test_kernel_source_belongs_to_its_configuration_and_is_read_only():
    """The launch-plan cache is keyed by the source's hash: a kernel's source is fixed at
    construction, and a source rendered for another configuration is refused."""
    from nmgen.runtime.launch import Kernel

    config = nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, a_layout="km")
    other = config.replace(split_k=2)
    assert Kernel(config).source == nmgen.render(config)
    with pytest.raises(ValueError, match=other.name):
        Kernel(config, nmgen.render(other))
    with pytest.raises(AttributeError):
        Kernel(config).source = nmgen.render(other)


def test_the_launch_after_a_copy_reaches_the_driver_as_programmatic():
    """The launch attribute as ``cuLaunchKernelEx`` reads it: CUlaunchConfig of 56 bytes,
    CUlaunchAttribute of 72 whose union (at 8) holds programmaticStreamSerializationAllowed
    = 1. (A c_char union read back as a copy once left it 0, unnoticed, in the tools.)"""
    import ctypes

    from nmgen.runtime.launch import _AfterPreviousLaunch, _LaunchAttribute, _LaunchConfig

    launch = _AfterPreviousLaunch((3, 2, 1), 256, 1024)
    raw = bytes(launch.attribute)
    assert ctypes.sizeof(_LaunchAttribute) == 72 and ctypes.sizeof(_LaunchConfig) == 56
    assert int.from_bytes(raw[:4], "little") == 6  # ..._PROGRAMMATIC_STREAM_SERIALIZATION
    assert int.from_bytes(raw[8:12], "little") == 1
    assert list(launch.config.grid) == [3, 2, 1] and list(launch.config.block) == [256, 1, 1]
    assert launch.config.smem == 1024 and launch.config.count == 1
    assert ctypes.addressof(launch.config.attrs.contents) == ctypes.addressof(launch.attribute)


def test_every_shipped_configuration_renders_the_source_it_was_timed_on():
    """The shipped database's records hold the hash of each kernel's source (its version
    line aside): the current generator must render every one of them unchanged, or the
    records time code that no longer runs (``nmgen carry`` re-keys them after a change)."""
    import sqlite3

    from nmgen.codegen import source_hash
    from nmgen.families.registry import config_from_dict
    from nmgen.store.database import shipped_db

    with sqlite3.connect(shipped_db()) as db:
        rows = db.execute("select name, params, source_hash from nm_kernel_configs").fetchall()
    assert len(rows) > 400  # the 800 problems' winners, runners-up and reference kernels
    changed = [name for name, params, stored in rows
               if source_hash(nmgen.render(config_from_dict(json.loads(params))).code) != stored]
    assert not changed, f"{len(changed)} shipped kernels render other code, e.g. {changed[:3]}"


def test_the_version_line_is_all_a_release_changes():
    from nmgen.codegen import VERSION_LINE, source_hash

    code = nmgen.render(nmgen.KernelConfig(8, 32, 32, 128, 128, 64, 8, 8)).code
    line = VERSION_LINE.search(code).group(0)
    assert f"nmgen {nmgen.__version__} from nmgen/families/f32_simt/templates/" in line
    assert source_hash(code.replace(line, line.replace(nmgen.__version__, "9.9.9"))) \
        == source_hash(code)
    assert source_hash(code.replace("fmaf(", "__fmaf_rn(")) != source_hash(code)
