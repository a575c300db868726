#!/usr/bin/env python3
"""Predicted against measured TPOT: `epinfer plan` for the layout, model and levels of each `epinfer bench
--json` file, side by side with the measured TPOT p50, and per concurrency the layout the plan picks against
the fastest measured (issue 6: within ±25 % per point and the same ranking; docs/benchmarks/planner.md).

  python3 bench/plan_vs_measured.py --epinfer build/tools/epinfer/epinfer \
      --hardware profiles/measured/h200x2_nvlink_epinfer_2026-11-30e.json --gpus 2 layouts_out/bench_*_nvlink.json

The bench files must share model, input and output lengths. A layout is named as the plan names it from the
bench's "tpA epB ppC dpD" (dpD with epB: dpD-epB; epB alone: epB, attention tensor-parallel).
"""
import argparse
import json
import subprocess
import sys


def plan_layout(bench_layout):
    parts = dict((p[:2], int(p[2:])) for p in bench_layout.split())
    tp, ep, pp, dp = parts["tp"], parts["ep"], parts["pp"], parts["dp"]
    names = []
    if pp > 1:
        names.append(f"pp{pp}")
    if dp > 1:
        names.append(f"dp{dp}-ep{ep}")
    elif ep > 1:
        names.append(f"ep{ep}")
    elif tp > 1:
        names.append(f"tp{tp}")
    return "-".join(names) if names else "tp1"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epinfer", required=True, help="the epinfer binary")
    ap.add_argument("--hardware", required=True, help="profile name or FILE.json")
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--tolerance", type=float, default=0.25, help="per-point target (default 0.25)")
    ap.add_argument("bench_json", nargs="+")
    args = ap.parse_args()

    measured = {}  # layout -> {C: TPOT p50 ms}
    model = None
    for path in args.bench_json:
        with open(path) as f:
            b = json.load(f)
        key = (b["model"], b["input_len"], b["output_len"])
        if model not in (None, key):
            sys.exit(f"{path}: model/lengths {key} differ from {model}")
        model = key
        measured[plan_layout(b["layout"])] = {r["concurrency"]: r["tpot_p50_ms"] for r in b["results"]}

    predicted = {}
    for layout, points in measured.items():
        levels = ",".join(str(c) for c in sorted(points))
        cmd = [args.epinfer, "plan", "--model", model[0], "--hardware", args.hardware, "--gpus", str(args.gpus),
               "--layout", layout, "--input-len", str(model[1]), "--output-len", str(model[2]),
               "--concurrency", levels, "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: {out.stderr.strip()}")
        (plan,) = json.loads(out.stdout)["layouts"]
        predicted[layout] = {d["concurrency"]: d["closed_loop"]["tpot_ms"] for d in plan["decode"]}

    inside = total = 0
    print(f"{'layout':10s} {'C':>5s} {'measured_ms':>12s} {'predicted_ms':>13s} {'ratio':>7s}")
    for layout, points in measured.items():
        for c in sorted(points):
            m, p = points[c], predicted[layout][c]
            ok = abs(p / m - 1) <= args.tolerance
            inside += ok
            total += 1
            print(f"{layout:10s} {c:5d} {m:12.2f} {p:13.2f} {p / m:7.2f}{'' if ok else '  outside'}")
    print(f"{inside} of {total} points within ±{args.tolerance:.0%}")
    levels = sorted(set.intersection(*(set(p) for p in measured.values())))
    for c in levels:
        by_measured = sorted(measured, key=lambda l: measured[l][c])
        by_plan = sorted(measured, key=lambda l: predicted[l][c])
        best, pick = by_measured[0], by_plan[0]
        regret = measured[pick][c] / measured[best][c] - 1
        print(f"C={c}: measured {' < '.join(by_measured)}; planned {' < '.join(by_plan)}; the plan's pick "
              f"{pick} is {regret:.1%} slower than the fastest measured ({best})")


if __name__ == "__main__":
    main()
