#!/usr/bin/env python3
"""Where a decode step's time goes, from a kernel timeline (bench/kernel_trace.cc's CSV).

Takes the kernels of the stream that ran most of them, in end order, cut into steps at each kernel named
--step-kernel (the step's last kernel, default argmax_kernel), and keeps the steps that ran inside CUDA
graphs (most of their kernels have a graph id: decode steps replay graphs). A kernel's *exposed* time is its end minus the previous kernel's end: with programmatic
dependent launch a kernel starts before the previous one ends, so its own duration (end − start) overstates
what it adds to the step, and the exposed times add up to the steps' time. The first --skip graph steps are
dropped (warm-up) and at most --steps are read.

Prints per kernel key (name and grid size) the calls per step, the mean exposed and own time per step, and
the total. Usage: bench/kernel_trace_summary.py trace.csv [--step-kernel NAME] [--skip N] [--steps N]
[--layers L] (with --layers, also per layer: the step's time minus the kernels that run once per step).
"""
import argparse
import collections
import csv
import re
import sys


def short(name):
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    name = re.sub(r"^(void )?epinfer::cuda::", "", name)
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--step-kernel", default="argmax_kernel")
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=0)
    a = ap.parse_args()

    rows = []
    with open(a.trace, newline="") as f:
        for r in csv.DictReader(f):
            rows.append((int(r["start_ns"]), int(r["end_ns"]), r["stream"], int(r["grid_x"]), short(r["name"]),
                         r["graph_id"] != "0"))
    if not rows:
        sys.exit(f"{a.trace}: no kernel")
    stream = collections.Counter(r[2] for r in rows).most_common(1)[0][0]
    rows = sorted((r for r in rows if r[2] == stream), key=lambda r: r[1])

    steps, cur = [], []
    for r in rows:
        cur.append(r)
        if a.step_kernel in r[4]:
            steps.append(cur)
            cur = []
    steps = [s for s in steps if 2 * sum(r[5] for r in s) > len(s)][a.skip:a.skip + a.steps]
    if not steps:
        sys.exit(f"{a.trace}: no graph step ending in {a.step_kernel} after skipping {a.skip}")

    exposed = collections.defaultdict(float)
    own = collections.defaultdict(float)
    calls = collections.Counter()
    step_us, gaps_us = [], []
    prev_end = None
    for s in steps:
        if prev_end is not None:
            gaps_us.append((s[0][0] - prev_end) / 1e3)
        # The first kernel of a step: exposed from the previous step's end only when the steps touch.
        t0 = s[0][0] if prev_end is None else max(prev_end, s[0][0])
        step_us.append((s[-1][1] - t0) / 1e3)
        last = t0
        for start, end, _, grid, name, _ in s:
            key = f"{name} [grid {grid}]"
            exposed[key] += (end - last) / 1e3
            own[key] += (end - start) / 1e3
            calls[key] += 1
            last = end
        prev_end = s[-1][1]
    n = len(steps)
    step_us.sort()
    print(f"{n} steps (skipped {a.skip}), {len(steps[0])} kernels in the first; step time median "
          f"{step_us[n // 2]:.1f} us, min {step_us[0]:.1f}, max {step_us[-1]:.1f}; between steps (host) median "
          f"{sorted(gaps_us)[len(gaps_us) // 2] if gaps_us else 0:.1f} us")
    print(f"{'kernel':<90} {'calls':>6} {'exposed us':>11} {'own us':>9}")
    total_exposed = 0.0
    per_step_once = 0.0
    for key in sorted(exposed, key=lambda k: -exposed[k]):
        e, o, c = exposed[key] / n, own[key] / n, calls[key] / n
        total_exposed += e
        if a.layers and c < a.layers / 2:
            per_step_once += e
        print(f"{key[:90]:<90} {c:>6.1f} {e:>11.2f} {o:>9.2f}")
    print(f"{'sum':<90} {'':>6} {total_exposed:>11.2f}")
    if a.layers:
        print(f"per layer: ({total_exposed:.1f} - {per_step_once:.1f} once per step) / {a.layers} = "
              f"{(total_exposed - per_step_once) / a.layers:.2f} us")


if __name__ == "__main__":
    main()
