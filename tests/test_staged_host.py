"""The staged A tile's index arithmetic, run on the host (no GPU): the template's own device
helpers (StagedA, the chunk map, the swizzle) are compiled with g++ behind a few stubs and
driven thread by thread; every element of the K-major compute tile must then hold A's
value (or zero outside A) at the place the compute loop reads it from."""

from __future__ import annotations

import shutil
import subprocess
import textwrap

import pytest

import nmgen
from nmgen.families.f32_simt.config import KernelConfig
from nmgen.problem import ALayout

pytestmark = pytest.mark.nvcc  # a C++ compiler; required in CI with nvcc

STUBS = """
#include <cmath>
#include <cstdio>
#include <vector>
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct Index { unsigned x = 0, y = 0, z = 0; };
Index threadIdx, blockIdx;
#define __device__
#define __forceinline__ inline
#define __noinline__
#define __restrict__
template <class T> T __ldg(const T* p) { return *p; }
inline unsigned __cvta_generic_to_shared(const void*) { return 0; }
"""

HARNESS = """
// Moves stage t of an M x K row-major A (row stride lda) for the block at row m0 into a
// compute tile, thread by thread, phase by phase, and checks every element.
int check(int M, int K, long long lda, int m0, int t, bool a_vec4) {
    std::vector<float> a(size_t(M) * lda, 0.f);
    for (int m = 0; m < M; ++m)
        for (int k = 0; k < K; ++k) a[size_t(m) * lda + k] = 1.f + m * 4096.f + k;
    std::vector<float> tile(A_WORDS, NAN);
    for (unsigned tid = 0; tid < THREADS; ++tid) {
        threadIdx.x = tid;
        const StagedA s(a.data(), m0, M, lda);
        float4 regs[PHASE_SLOTS];
        for (int p = 0; p < A_PHASES; ++p) {
            if (a_full(t, K, a_vec4)) s.load(regs, p, t);
            else s.load_edge(regs, p, t, K);
            s.store(tile.data(), regs, p);
        }
    }
    int bad = 0;
    for (int kk = 0; kk < A_ROWS; ++kk)
        for (int m = 0; m < MS; ++m) {
            const int gm = m0 + m, k = t * KS + kk;
            const float want = gm < M && k < K ? a[size_t(gm) * lda + k] : 0.f;
            const float got = tile[kk * A_STRIDE + (m ^ swizzle_of(kk))];
            if (!(got == want) && bad++ < 5)
                std::printf("kk=%d m=%d: got %g want %g\\n", kk, m, got, want);
        }
    return bad;
}

int main() {
    int bad = 0;
    // interior block, full stage; M edge inside the block; K edge (last, partial stage);
    // rows not 16-byte aligned (the single-float path)
    bad += check(3 * MS, 4 * KS, 4 * KS, MS, 1, true);
    bad += check(MS + MS / 2 + 1, 4 * KS, 4 * KS + 4, MS, 2, true);
    bad += check(2 * MS, 3 * KS + 5, 3 * KS + 8, 0, 3, true);
    bad += check(MS - 3, 2 * KS + 2, 2 * KS + 3, 0, 1, false);
    std::printf("bad %d\\n", bad);
    return bad != 0;
}
"""


def helpers(config: KernelConfig) -> str:
    code = nmgen.render(config).code
    return code[code.index("namespace {"):code.index("}  // namespace") + 15]


CONFIGS = [
    KernelConfig(12, 32, 32, 128, 256, 64, 16, 8, warp_m=8, warp_n=4, stages=3, a_tile="tr"),
    KernelConfig(8, 32, 32, 128, 256, 128, 16, 8, warp_m=8, warp_n=4, stages=2, a_tile="tr"),
    KernelConfig(4, 32, 32, 64, 128, 32, 4, 8, warp_m=8, warp_n=4, stages=1, a_tile="tr"),
    KernelConfig(2, 4, 8, 96, 64, 32, 4, 4, warp_m=8, warp_n=4, stages=2, a_tile="tr"),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_staged_tile_holds_a_transposed(config, tmp_path):
    assert config.staged and config.a_layout is ALayout.ROW_MAJOR
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "no C++ compiler"
    source = tmp_path / "staged.cpp"
    source.write_text(STUBS + helpers(config) + textwrap.dedent(HARNESS))
    build = subprocess.run([compiler, "-std=c++17", "-O1", "-w", "-o", str(tmp_path / "t"),
                            str(source)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "bad 0" in run.stdout, run.stdout[-2000:]
