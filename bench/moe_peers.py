#!/usr/bin/env python3
"""PyTorch peers of `epinfer bench moe`: the same MoE shapes, routing and seeds, timed on the same GPU.

Reads the JSON that `epinfer bench moe --json FILE` wrote, and for every (shape, routing, tokens) row times
two PyTorch implementations of the routed experts (the work of epinfer's `routed_us` column: permute →
gate_up → SiLU·up → down → weighted combine, no router, no shared expert), each over random bf16 weights:

  grouped_mm  sort the picks by expert, gather the rows, two torch._grouped_mm calls with device-side
              offsets, SiLU·up, weighted scatter-add (index_add_) back to the tokens;
  loop        the same sort and gather, then a Python loop of torch.matmul per expert with a non-empty
              group (per-expert sizes read on the host, as the eager Hugging Face MoE blocks do).

Timing as epinfer's: CUDA events around each call, a 512 MiB L2 flush before each, median of --repeats
after warm-ups. The routing is epinfer's moe_bench_routing (backend/cuda/moe_bench.h), reimplemented here
bit for bit (splitmix64, cumulative weights, rejection of repeats); the distinct-expert count of each row is
checked against epinfer's. The final table gives epinfer's speedup over each peer.

  epinfer bench moe --json moe.json
  python3 bench/moe_peers.py --epinfer-json moe.json --out-json moe_peers.json --out-md moe_peers.md
"""
import argparse
import bisect
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F

MASK64 = (1 << 64) - 1
PEAK_BYTES_PER_S = 4.8e12
PEAK_FLOPS_PER_S = 989e12
FLUSH_BYTES = 512 << 20


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):
        return (self.next() >> 11) * (1.0 / 9007199254740992.0)


def draw(rng, cum):
    x = rng.uniform() * cum[-1]
    return min(bisect.bisect_right(cum, x), len(cum) - 1)


def bench_routing(tokens, row, zipf, seed):
    """epinfer's moe_bench_routing: ids [T, K] as a list of lists."""
    num_experts, top_k = row["num_experts"], row["top_k"]
    n_group, topk_group = row["n_group"], row["topk_group"]
    group_limited = row["grouped_routing"]
    group_size = num_experts // n_group
    weight = [(1.0 / (e + 1)) if zipf else 1.0 for e in range(num_experts)]
    cum, total = [], 0.0
    for w in weight:
        total += w
        cum.append(total)
    group_cum, group_total = [], 0.0
    for g in range(n_group):
        s = 0.0
        for e in range(g * group_size, (g + 1) * group_size):
            s += weight[e]
        group_total += s
        group_cum.append(group_total)
    rng = SplitMix64(seed * 1000003 + 2 * tokens + (1 if zipf else 0))
    ids = []
    for _ in range(tokens):
        kept = None
        if group_limited:
            kept = set()
            while len(kept) < topk_group:
                kept.add(draw(rng, group_cum))
        picks = []
        while len(picks) < top_k:
            e = draw(rng, cum)
            if kept is not None and e // group_size not in kept:
                continue
            if e in picks:
                continue
            picks.append(e)
        ids.append(picks)
    return ids


def time_us(fn, repeats, flush, warmups=2):
    """Median µs of `repeats` calls of fn, each after `flush` is rewritten (L2 flush), after warm-up calls."""
    for _ in range(warmups):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for i in range(repeats):
        flush.fill_(i & 0xFF)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(1000.0 * s.elapsed_time(e) for s, e in zip(starts, ends))


def sort_picks(ids, top_k, num_experts):
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // top_k
    counts = torch.bincount(flat, minlength=num_experts)
    return order, token, counts


def grouped_mm_path(x, ids, topk_w, w_gate_up_t, w_down_t, inter):
    """Sort by expert, two torch._grouped_mm calls with device offsets, weighted scatter-add."""
    num_experts, top_k = w_gate_up_t.shape[0], ids.shape[1]
    order, token, counts = sort_picks(ids, top_k, num_experts)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    xs = x[token]
    gu = torch._grouped_mm(xs, w_gate_up_t, offs=offs)
    h = F.silu(gu[:, :inter]) * gu[:, inter:]
    y = torch._grouped_mm(h, w_down_t, offs=offs)
    y = y * topk_w.reshape(-1)[order].unsqueeze(1).to(y.dtype)
    return torch.zeros_like(x).index_add_(0, token, y)


def loop_path(x, ids, topk_w, w_gate_up, w_down, inter):
    """The same sort, then torch.matmul per expert with a non-empty group (host-side sizes)."""
    num_experts, top_k = w_gate_up.shape[0], ids.shape[1]
    order, token, counts = sort_picks(ids, top_k, num_experts)
    xs = x[token]
    y = torch.empty_like(xs)
    start = 0
    for e, c in enumerate(counts.tolist()):
        if c == 0:
            continue
        seg = xs[start:start + c]
        gu = torch.matmul(seg, w_gate_up[e].t())
        h = F.silu(gu[:, :inter]) * gu[:, inter:]
        y[start:start + c] = torch.matmul(h, w_down[e].t())
        start += c
    y = y * topk_w.reshape(-1)[order].unsqueeze(1).to(y.dtype)
    return torch.zeros_like(x).index_add_(0, token, y)


def sol(bytes_, flops, us):
    return max(bytes_ / PEAK_BYTES_PER_S, flops / PEAK_FLOPS_PER_S) / (us * 1e-6) if us > 0 else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epinfer-json", required=True, help="output of `epinfer bench moe --json`")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--skip-loop-above", type=int, default=1 << 30,
                    help="skip the per-expert loop above this many tokens (it is slow)")
    ap.add_argument("--out-json", help="merged results")
    ap.add_argument("--out-md", help="merged table, markdown")
    args = ap.parse_args()

    with open(args.epinfer_json) as f:
        doc = json.load(f)
    seed = doc["seed"]
    dev = torch.device("cuda")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}; epinfer: {doc['gpu']}", flush=True)

    shapes = []
    for row in doc["rows"]:
        if row["shape"] not in shapes:
            shapes.append(row["shape"])
    merged = []
    for shape in shapes:
        rows = [r for r in doc["rows"] if r["shape"] == shape]
        r0 = rows[0]
        hid, inter, num_experts = r0["hidden"], r0["intermediate"], r0["num_experts"]
        gen = torch.Generator(device=dev).manual_seed(1234)
        w_gate_up = (torch.rand(num_experts, 2 * inter, hid, device=dev, generator=gen, dtype=torch.float32)
                     .mul_(2).sub_(1).mul_(1 / math.sqrt(hid)).to(torch.bfloat16))
        w_down = (torch.rand(num_experts, hid, inter, device=dev, generator=gen, dtype=torch.float32)
                  .mul_(2).sub_(1).mul_(1 / math.sqrt(inter)).to(torch.bfloat16))
        torch.cuda.empty_cache()
        w_gate_up_t, w_down_t = w_gate_up.transpose(1, 2), w_down.transpose(1, 2)  # [E, K, N], column-major
        for r in rows:
            tokens, zipf = r["tokens"], r["routing"] == "zipf"
            ids_list = bench_routing(tokens, r, zipf, seed)
            touched = len({e for picks in ids_list for e in picks})
            ids = torch.tensor(ids_list, dtype=torch.int64, device=dev)
            topk_w = torch.rand(tokens, r["top_k"], device=dev, generator=gen)
            x = torch.rand(tokens, hid, device=dev, generator=gen).mul_(2).sub_(1).to(torch.bfloat16)
            out = dict(r)
            out["peer_routing_check"] = "ok" if touched == r["experts_touched"] else f"MISMATCH {touched}"
            try:
                out["grouped_mm_us"] = time_us(
                    lambda: grouped_mm_path(x, ids, topk_w, w_gate_up_t, w_down_t, inter), args.repeats, flush)
            except Exception as exc:  # report, keep going
                out["grouped_mm_us"] = None
                out["grouped_mm_error"] = str(exc).splitlines()[0][:200]
            if tokens <= args.skip_loop_above:
                out["loop_us"] = time_us(lambda: loop_path(x, ids, topk_w, w_gate_up, w_down, inter),
                                         args.repeats, flush)
            else:
                out["loop_us"] = None
            for peer in ("grouped_mm", "loop"):
                us = out[f"{peer}_us"]
                out[f"{peer}_sol"] = sol(r["routed_weight_bytes"], r["routed_flops"], us) if us else None
                out[f"speedup_vs_{peer}"] = us / r["routed_time_us"] if us else None
            merged.append(out)
            fmt = lambda v, spec: ("-" if v is None else format(v, spec))
            print(f"{shape:<24} {r['routing']:<7} {tokens:>6} epinfer {r['routed_time_us']:>9.1f} us "
                  f"grouped_mm {fmt(out['grouped_mm_us'], '>9.1f')} loop {fmt(out['loop_us'], '>9.1f')} "
                  f"x{fmt(out['speedup_vs_grouped_mm'], '.2f')} x{fmt(out['speedup_vs_loop'], '.2f')} "
                  f"{out['peer_routing_check']}", flush=True)
            del ids, topk_w, x
        del w_gate_up, w_down, w_gate_up_t, w_down_t
        torch.cuda.empty_cache()

    header = ("| shape | routing | T | experts | epinfer layer µs (SOL) | epinfer routed µs (SOL) | "
              "grouped_mm µs (SOL) | loop µs (SOL) | speedup vs grouped_mm | speedup vs loop |")
    lines = [header, "|" + "---|" * 10]
    for m in merged:
        def cell(us, s):
            return "-" if us is None else f"{us:.1f} ({s:.2f})"
        lines.append(
            f"| {m['shape']} | {m['routing']} | {m['tokens']} | {m['experts_touched']} | "
            f"{cell(m['time_us'], m['sol'])} | {cell(m['routed_time_us'], m['routed_sol'])} | "
            f"{cell(m['grouped_mm_us'], m['grouped_mm_sol'] or 0)} | {cell(m['loop_us'], m['loop_sol'] or 0)} | "
            f"{'-' if m['speedup_vs_grouped_mm'] is None else format(m['speedup_vs_grouped_mm'], '.2f')} | "
            f"{'-' if m['speedup_vs_loop'] is None else format(m['speedup_vs_loop'], '.2f')} |")
    table = "\n".join(lines)
    print(table)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(table + "\n")
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump({"torch": torch.__version__, "epinfer": doc, "rows": merged}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
