#!/usr/bin/env python3
"""Where a step's time goes, from a kernel timeline (bench/kernel_trace.cc's CSV).

A kernel's *exposed* time is its end minus the previous kernel's end on the stream: with programmatic
dependent launch a kernel starts before the previous one ends, so its own duration (end − start)
overstates what it adds, and the exposed times of a step add up to the step's time. Only the stream that
ran the most kernels is read, in end order.

Steps (default): the kernels cut at each kernel named --step-kernel (the step's last kernel, default
argmax_kernel: a decode step), keeping the steps that ran inside CUDA graphs (most of their kernels have a
graph id: decode steps replay graphs); the first --skip of them are dropped (warm-up), at most --steps are
read. Prints per kernel (name and grid size) the calls per step and the mean exposed and own time per
step, the total, and the host time between consecutive graph steps. With --layers L, also the time per
layer: the step's time less the kernels that run fewer than L / 2 times per step.

--graphs: per CUDA graph instead (a run that replays one graph many times, e.g. `epinfer bench moe`): each
launch of a graph is the run of consecutive kernels with its graph id; prints per graph and per kernel
position the median own and exposed time over the launches after the first (warm-up).

Usage: bench/kernel_trace_summary.py trace.csv [--step-kernel NAME] [--skip N] [--steps N] [--layers L]
       bench/kernel_trace_summary.py trace.csv --graphs
"""
import argparse
import collections
import csv
import re
import statistics
import sys


def read_stream(path):
    """(start_ns, end_ns, graph_id, grid_x, name) of the busiest stream's kernels, in end order."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            name = re.sub(r"^(void )?epinfer::cuda::", "", r["name"])
            rows.append((int(r["start_ns"]), int(r["end_ns"]), (r.get("device", "0"), r["stream"]),
                         r["graph_id"], int(r["grid_x"]), name))
    if not rows:
        sys.exit(f"{path}: no kernel")
    stream = collections.Counter(r[2] for r in rows).most_common(1)[0][0]
    return sorted(((r[0], r[1], r[3], r[4], r[5]) for r in rows if r[2] == stream), key=lambda r: r[1])


def summarize_steps(rows, a):
    steps, cur = [], []
    for r in rows:
        cur.append(r)
        if a.step_kernel in r[4]:
            steps.append(cur)
            cur = []
    # (index among all steps, kernels) of the graph steps
    graph_steps = [(i, s) for i, s in enumerate(steps) if 2 * sum(r[2] != "0" for r in s) > len(s)]
    graph_steps = graph_steps[a.skip:a.skip + a.steps]
    if not graph_steps:
        sys.exit(f"{a.trace}: no graph step ending in {a.step_kernel} after skipping {a.skip}")
    exposed, own, calls = collections.defaultdict(float), collections.defaultdict(float), collections.Counter()
    step_us, gaps_us = [], []
    prev = None  # (index, end) of the previous graph step
    for i, s in graph_steps:
        touching = prev is not None and prev[0] == i - 1
        if touching:
            gaps_us.append((s[0][0] - prev[1]) / 1e3)
        t0 = max(prev[1], s[0][0]) if touching else s[0][0]
        step_us.append((s[-1][1] - t0) / 1e3)
        last = t0
        for start, end, _, grid, name in s:
            key = f"{name} [grid {grid}]"
            exposed[key] += (end - last) / 1e3
            own[key] += (end - start) / 1e3
            calls[key] += 1
            last = end
        prev = (i, s[-1][1])
    n = len(graph_steps)
    gap = f"{statistics.median(gaps_us):.1f} us" if gaps_us else "none (no consecutive graph steps)"
    print(f"{n} steps (skipped {a.skip}), {len(graph_steps[0][1])} kernels in the first; step time median "
          f"{statistics.median(step_us):.1f} us, min {min(step_us):.1f}, max {max(step_us):.1f}; between "
          f"consecutive steps (host) median {gap}")
    print(f"{'kernel':<90} {'calls':>6} {'exposed us':>11} {'own us':>9}")
    total = once = 0.0
    for key in sorted(exposed, key=lambda k: -exposed[k]):
        e, o, c = exposed[key] / n, own[key] / n, calls[key] / n
        total += e
        if a.layers and c < a.layers / 2:
            once += e
        print(f"{key[:90]:<90} {c:>6.1f} {e:>11.2f} {o:>9.2f}")
    print(f"{'sum':<90} {'':>6} {total:>11.2f}")
    if a.layers:
        print(f"per layer: ({total:.1f} - {once:.1f} once per step) / {a.layers} = {(total - once) / a.layers:.2f} us")


def summarize_graphs(rows):
    launches = collections.defaultdict(list)  # graph id → [kernels of one launch]
    cur, gid = [], None
    for r in rows + [(0, 0, "0", 0, "")]:  # a sentinel closes the last launch
        if r[2] != gid and cur:
            launches[gid].append(cur)
            cur = []
        gid = r[2]
        if gid != "0":
            cur.append(r)
    for gid, runs in launches.items():
        runs = runs[1:] if len(runs) > 1 else runs
        shape = [k[4] for k in runs[0]]
        runs = [l for l in runs if [k[4] for k in l] == shape]  # launches of the same kernels only
        print(f"graph {gid}: {len(runs)} launches of {len(shape)} kernels, span median "
              f"{statistics.median((l[-1][1] - l[0][0]) / 1e3 for l in runs):.1f} us")
        print(f"  {'kernel':<78} {'grid':>7} {'own us':>9} {'exposed us':>11}")
        for i, k in enumerate(runs[0]):
            own = statistics.median((l[i][1] - l[i][0]) / 1e3 for l in runs)
            exp = statistics.median((l[i][1] - (l[i - 1][1] if i else l[i][0])) / 1e3 for l in runs)
            print(f"  {k[4][:78]:<78} {k[3]:>7} {own:>9.1f} {exp:>11.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--step-kernel", default="argmax_kernel")
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--graphs", action="store_true")
    a = ap.parse_args()
    rows = read_stream(a.trace)
    if a.graphs:
        summarize_graphs(rows)
    else:
        summarize_steps(rows, a)


if __name__ == "__main__":
    main()
