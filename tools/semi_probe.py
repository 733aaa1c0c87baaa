"""How much of the semi-structured 2:4 figure is host setup: queue-ahead 100 us vs 3 ms vs a CUDA graph."""
import torch
from torch.sparse import to_sparse_semi_structured
from nmgen.runtime.timing import time_ms
from nmgen.bench.decode import _semi_ms
torch.manual_seed(0)
for M, N, K in [(256, 2048, 2048), (4096, 4096, 4096), (32, 4096, 11008), (2048, 22016, 8192)]:
    mask = torch.tensor([1, 1, 0, 0], device="cuda", dtype=torch.bfloat16).repeat(N, K // 4)
    w = (torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * mask).contiguous()
    ws = [to_sparse_semi_structured(w.clone()) for _ in range(4)]
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    f = lambda i: torch.nn.functional.linear(x, ws[i % 4])
    d = lambda i: torch.nn.functional.linear(x, w)
    g = torch.cuda.CUDAGraph(); f(0); torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for i in range(10):
            f(i)
    res = {"bench _semi_ms": _semi_ms(x, ws, 20), "q100": time_ms(f, repeat=20), "q3000": time_ms(f, repeat=20, queue_ahead_us=3000),
           "graph/10": time_ms(lambda i: g.replay(), repeat=10, queue_ahead_us=3000) / 10, "dense q100": time_ms(d, repeat=20)}
    print(M, N, K, " ".join(f"{k}={v*1000:.1f}us" for k, v in res.items()), flush=True)
