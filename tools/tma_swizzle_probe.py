"""Does TMA's 128-byte swizzle follow the shared-memory address? Eight one-row boxes (64 bf16 =
128 B each, rows chosen at random: a gather) copied to consecutive 128-B rows of a shared tile;
each 16-B chunk's source compared with the pattern wgmma reads: chunk c of tile row j holds
source chunk c ^ (j % 8). Base at 1024-B alignment and at 128-B (3 rows in)."""
import ctypes
import numpy as np
import cupy as cp

SRC = r'''
struct alignas(64) TmaMap { unsigned long long w[16]; };
__device__ __forceinline__ unsigned s32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
extern "C" __global__ void probe(const __grid_constant__ TmaMap map, const int* rows, int offset,
                                 unsigned short* out) {
    __shared__ alignas(1024) unsigned char tile[4096];
    __shared__ alignas(8) unsigned long long bar;
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(s32(&bar)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(s32(&bar)), "r"(8 * 128) : "memory");
        for (int j = 0; j < 8; ++j)
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                         " [%0], [%1, {%2, %3}], [%4];"
                         :: "r"(s32(tile + offset + j * 128)), "l"(&map), "r"(0), "r"(rows[j]), "r"(s32(&bar)) : "memory");
    }
    asm volatile("{ .reg .pred done;\nW: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n @!done bra W;\n}"
                 :: "r"(s32(&bar)) : "memory");
    for (int i = threadIdx.x; i < 8 * 64; i += blockDim.x)
        out[i] = reinterpret_cast<unsigned short*>(tile + offset)[i];
}
'''
K, M = 512, 64
src = (np.arange(K)[:, None] * 64 + np.arange(M)[None, :]).astype(np.uint16)  # row k, col m
d_src = cp.asarray(src)
mod = cp.RawModule(code=SRC, options=("-std=c++17", "-arch=sm_90a"))
kernel = mod.get_function("probe")
mp = (ctypes.c_uint64 * 16)()
enc = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
u32, u64 = ctypes.c_uint32, ctypes.c_uint64
status = enc(ctypes.byref(mp), 1, u32(2), ctypes.c_void_p(d_src.data.ptr), (u64 * 2)(M, K),
             (u64 * 1)(M * 2), (u32 * 2)(64, 1), (u32 * 2)(1, 1), 0, 3, 0, 0)  # SWIZZLE_128B
print("encode status", status)
rng = np.random.default_rng(0)
rows = cp.asarray(rng.choice(K, 8, replace=False).astype(np.int32))
for offset in (0, 3 * 128):
    out = cp.zeros(8 * 64, cp.uint16)
    args = [mp, ctypes.c_uint64(rows.data.ptr), ctypes.c_int32(offset), ctypes.c_uint64(out.data.ptr)]
    params = (ctypes.c_void_p * 4)(*[ctypes.addressof(a) for a in args])
    launch = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    st = launch(ctypes.c_void_p(kernel.kernel.ptr), 1, 1, 1, 128, 1, 1, 0, None, params, None)
    cp.cuda.runtime.deviceSynchronize()
    print("launch status", st)
    got = cp.asnumpy(out).reshape(8, 8, 8)  # tile row j, chunk c, element
    want_rows = cp.asnumpy(rows)
    for name, rule in (("address", lambda j, c: c ^ ((j + offset // 128) % 8)),
                       ("box row", lambda j, c: c), ("tile row", lambda j, c: c ^ (j % 8))):
        ok = all((got[j, c] == src[want_rows[j], rule(j, c) * 8:(rule(j, c) + 1) * 8]).all()
                 for j in range(8) for c in range(8))
        print(f"base +{offset} B: swizzle by {name}: {ok}")
