#!/usr/bin/env python3
"""PyTorch's NCCL collectives, the peer of `epinfer bench comm --device cuda`, on the same GPUs.

One process per GPU (torch.multiprocessing; NCCL through torch.distributed, the library PyTorch ships),
fp32, the sizes of epinfer's bench comm (min-bytes ×4 … max-bytes, nccl-tests' size convention: the
all_reduce buffer, the gathered buffer, what each rank sends in the all-to-all). Per size and op, the same
two figures as epinfer's:
  time_us    one op from a barrier until torch.cuda.synchronize() returns, median of --iters, the slowest
             rank's;
  queued_us  --iters ops issued back to back, then one synchronize, per op (nccl-tests' figure), the
             slowest rank's.
Every result is checked against rank-coded values (all_reduce: torch's in place; a fresh run is checked). Prints one table and, with --json, writes it.

  python3 bench/comm_peer_torch.py --ranks 2 --max-bytes 256M --json comm_torch.json
  NCCL_P2P_DISABLE=1 python3 bench/comm_peer_torch.py --ranks 2
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def bench_op(op, size_bytes, rank, n, iters, warmup):
    count = max(1, size_bytes // 4 if op == "all_reduce" else size_bytes // 4 // n)
    dev = torch.device("cuda", rank)
    i = torch.arange(count, device=dev)
    if op == "all_reduce":
        send = ((rank + 1) * (i % 13 + 1)).float()
        recv = send.clone()
        run = lambda: dist.all_reduce(recv)  # noqa: E731  in place (torch has no out-of-place all_reduce)
        expected = (n * (n + 1) // 2 * (i % 13 + 1)).float()
    elif op == "all_gather":
        send = (rank * 64 + i % 61).float()
        recv = torch.empty(count * n, device=dev)
        run = lambda: dist.all_gather_into_tensor(recv, send)  # noqa: E731
        expected = torch.cat([(r * 64 + i % 61).float() for r in range(n)])
    else:
        send = torch.cat([(rank * 1024 + d * 32 + i % 31).float() for d in range(n)])
        recv = torch.empty(count * n, device=dev)
        run = lambda: dist.all_to_all_single(recv, send)  # noqa: E731
        expected = torch.cat([(s * 1024 + rank * 32 + i % 31).float() for s in range(n)])
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        run()
    torch.cuda.synchronize()
    queued_us = (time.perf_counter() - start) * 1e6 / iters
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    if op == "all_reduce":  # the timed runs summed the buffer again and again: check one fresh run
        recv.copy_(send)
        run()
    wrong = int((recv != expected).sum().item())
    vals = torch.tensor([queued_us] + times + [float(wrong)], dtype=torch.float64, device=dev)
    dist.all_reduce(vals[:-1], op=dist.ReduceOp.MAX)
    dist.all_reduce(vals[-1:], op=dist.ReduceOp.SUM)
    vals = vals.tolist()
    size = count * 4 if op == "all_reduce" else count * 4 * n
    return {"op": op, "size_bytes": size, "count": count, "time_us": statistics.median(vals[1:-1]),
            "queued_us": vals[0], "wrong": int(vals[-1])}


def worker(rank, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=args.ranks, device_id=torch.device("cuda", rank))
    rows = []
    for op in ("all_reduce", "all_gather", "all_to_all_v"):
        size = parse_bytes(args.min_bytes)
        while size <= parse_bytes(args.max_bytes):
            rows.append(bench_op(op, size, rank, args.ranks, args.iters, args.warmup_iters))
            size *= 4
    if rank == 0:
        print(f"# torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
              f"{args.ranks} ranks, fp32, median of {args.iters}; "
              f"NCCL_P2P_DISABLE={os.environ.get('NCCL_P2P_DISABLE', '')}")
        print(f"{'op':<13} {'size_bytes':>12} {'time_us':>10} {'queued_us':>10} {'check':>6}")
        for r in rows:
            print(f"{r['op']:<13} {r['size_bytes']:>12} {r['time_us']:>10.1f} {r['queued_us']:>10.1f} "
                  f"{'ok' if r['wrong'] == 0 else 'FAIL':>6}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"bench": "comm_peer_torch", "ranks": args.ranks, "torch": torch.__version__,
                           "results": rows}, f, indent=1)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=torch.cuda.device_count())
    p.add_argument("--min-bytes", default="1K")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup-iters", type=int, default=2)
    p.add_argument("--json", default="")
    args = p.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
