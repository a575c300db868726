#!/usr/bin/env python3
"""cuBLAS bf16 GEMMs (through PyTorch) at the projection shapes of Qwen3-30B-A3B: q, k and v as three GEMMs
against one GEMM of the concatenated weights (fp32 output, as the engine writes), CUDA-graph timed, medians
in µs. Run on the GPU machine: python3 bench/projection_gemm_probe.py (docs/benchmarks/serving.md)."""
import torch

H, Q, KV = 2048, 4096, 512  # hidden, q rows (32 heads × 128), k and v rows (4 heads × 128)


def timed(fn, reps=50, inner=20):
    """Median µs of one fn() over `reps` replays of a graph of `inner` calls."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / inner)
    return sorted(times)[len(times) // 2]


def main():
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    wq, wk, wv = torch.randn(Q, H, **bf16), torch.randn(KV, H, **bf16), torch.randn(KV, H, **bf16)
    wo = torch.randn(H, Q, **bf16)
    wqkv = torch.cat([wq, wk, wv])

    def mm(x, w):
        return torch.mm(x, w.t(), out_dtype=torch.float32)

    print("T sep_qkv_us fused_qkv_us q_us k_us o_us")
    for t in [17, 32, 64, 128, 256, 512, 1024]:
        x, xo = torch.randn(t, H, **bf16), torch.randn(t, Q, **bf16)
        sep = timed(lambda: (mm(x, wq), mm(x, wk), mm(x, wv)))
        fused = timed(lambda: mm(x, wqkv))
        q, k, o = timed(lambda: mm(x, wq)), timed(lambda: mm(x, wk)), timed(lambda: mm(xo, wo))
        print(f"{t} {sep:.1f} {fused:.1f} {q:.1f} {k:.1f} {o:.1f}")


if __name__ == "__main__":
    main()
