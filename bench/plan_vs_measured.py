#!/usr/bin/env python3
"""Predicted against measured TPOT: `epinfer plan` for the layout, model and levels of each `epinfer bench
--json` file, side by side with the measured TPOT p50, and per concurrency the layout the plan picks against
the fastest measured (issue 6: within ±25 % per point and the same ranking; docs/benchmarks/planner.md).

  python3 bench/plan_vs_measured.py --epinfer build/tools/epinfer/epinfer \
      --hardware profiles/measured/h200x2_nvlink_epinfer_2026-11-30e.json --gpus 2 layouts_out/bench_*_nvlink.json

The bench files must share model, input and output lengths. A layout is the bench's own layout flags (--pp,
--tp, --dp, --ep of its command_line), given to the plan as its spec (e.g. "--dp 2 --ep 2" is dp2-ep2).
"""
import argparse
import json
import subprocess
import sys


def plan_layout(command_line):
    """The plan's spec of a bench command line's layout flags: "--dp 2 --ep 2" -> "dp2-ep2"; none -> "tp1"."""
    words = command_line.split()
    flags = {}
    for i, w in enumerate(words[:-1]):
        if w in ("--pp", "--tp", "--dp", "--ep"):
            flags[w[2:]] = int(words[i + 1])
    spec = "-".join(f"{k}{flags[k]}" for k in ("pp", "tp", "dp", "ep") if k in flags)
    return spec or "tp1"


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
        try:
            with open(path) as f:
                b = json.load(f)
            key = (b["model"], b["input_len"], b["output_len"])
            layout = plan_layout(b["command_line"])
            results = {r["concurrency"]: r["tpot_p50_ms"] for r in b["results"]}
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"{path}: not an `epinfer bench --json` file ({type(e).__name__}: {e})")
        if model not in (None, key):
            sys.exit(f"{path}: model/lengths {key} differ from {model}")
        model = key
        measured[layout] = results

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
