#!/usr/bin/env python3
"""Writes the engine-calibrated multi-GPU H200 profiles of this folder:
  h200x2_nvlink_epinfer_2026-11-29.json, h200x2_no_p2p_epinfer_2026-11-29.json (2 H200s),
  h200x4_nvlink_epinfer_2026-11-29.json, h200x4_no_p2p_epinfer_2026-11-29.json (4 H200s), over the one-GPU
  calibration of the engine of 2026-11-29 (h200_epinfer_2026-11-29.json: fp32 KV cache, commit 6c868cd);
  h200x2_nvlink_epinfer_2026-11-30.json, h200x2_no_p2p_epinfer_2026-11-30.json (2 H200s), over the one-GPU
  calibration of the engine of 2026-11-30 (h200_epinfer_2026-11-30.json: bf16 KV cache, flash attention, the
  gemv MoE tile; commit dc6daa7 + working tree);
  h200x2_nvlink_epinfer_2026-11-30b.json, h200x2_no_p2p_epinfer_2026-11-30b.json (2 H200s), over the one-GPU
  calibration of the engine of 7dc5532/011e3cc (h200_epinfer_2026-11-30b.json: the gemv tile height by
  tokens, pick mode at one token; the engine HEAD ccc87c8 runs, whose 2-GPU layouts docs/benchmarks/
  multi_gpu.md measured at 2026-11-30 12:51 UTC);
  h200x2_nvlink_epinfer_2026-11-30d.json, h200x2_no_p2p_epinfer_2026-11-30d.json (2 H200s), over the one-GPU
  calibration of the engine of 04be258 (h200_epinfer_2026-11-30d.json: fdefb56's fused norms and q/k
  preparation, 77f1e2f's projections of one input in one launch, 04be258's few-row matmul; its 2-GPU layouts
  measured at 2026-11-30 13:32 UTC). The 2026-11-30 and 2026-11-30b files stay as the records of dc6daa7's
  and ccc87c8's engines.
  Those use the same 2026-11-29 NCCL runs, made with the non-blocking communicators of the time (~80 us of
  host time per collective, docs/benchmarks/multi_gpu.md); no 4-GPU profile is made over a 2026-11-30 base,
  since the 4-GPU host_round_trip_us was fitted against predictions with the 2026-11-29 base.
  h200x2_nvlink_epinfer_2026-11-30e.json, h200x2_no_p2p_epinfer_2026-11-30e.json (2 H200s): the 30d base
  (04be258's engine: 5eb5b48's one-GPU step is the same) with the collectives of the blocking communicators
  (81d2fcc), measured 2026-11-30 15:02 UTC by the binaries of 5eb5b48 (h200x2_*_nccl_2026-11-30e.json), and
  gpu.host_round_trip_us with gpu.host_round_trip_us_per_row FITTED to the dp2-ep2 runs over NVLink of that
  build (below); the no-P2P runs are the held-out check.
  h200x4_nvlink_epinfer_2026-11-30f.json, h200x4_no_p2p_epinfer_2026-11-30f.json (4 H200s): the 30d base, the
  4-rank collectives of the blocking communicators measured 2026-11-30 22:17/22:19 UTC by the binaries of
  25df76b (h200x4_*_nccl_2026-11-30f.json, --max-bytes 64M), the 2-rank tables of the 30e run, and the 30e
  profiles' host figures (fitted on 2 GPUs): nothing in them is fitted to the 4-GPU layout runs they price.

Each is what `epinfer bench comm --device cuda --ranks N ... --profile-out OUT --base-profile BASE` writes
(planner/calibration.h calibrated_profile_json), BASE the one-GPU profile of its date:
the one-GPU engine calibration (gpu.*) with intra_node.{all_reduce, all_gather, all_to_all} replaced by
the N x H200 measurements (the bench's --profile-out of that run, copied verbatim: the same points give the
same least-squares fit):
  - 2 GPUs: h200x2_{nvlink,no_p2p}_nccl_queued_2026-11-29.json (2026-11-29 20:39 UTC, lent kind
    nvidia-h200-x2, build 01c461a), fit and the 2-rank table;
  - 4 GPUs: h200x4_{nvlink,no_p2p}_nccl_2026-11-29.json (20:12 UTC, nvidia-h200-x4, build 01c461a), fit
    and the 4-rank table, plus the 2-rank table of the 2-GPU run (the same H200 SXM NV18 machine type, the
    same link setting), which the planner uses for the 2-rank groups of a 4-GPU layout (tp2-pp2);
plus what the bench does not measure:
  - gpu.eager_kernel_us: fitted to the one-GPU --no-decode-graphs runs of the base's engine (below; the
    base's own figure); the 2026-11-30b base's engine has no such runs: its profile keeps the 2026-11-30
    figure (1.78 us, fitted to dc6daa7's engine, not re-measured) and so do its 2-GPU profiles, as is, and
    the same for the 2026-11-30d base (04be258's engine);
  - gpu.host_round_trip_us: in the 4-GPU profiles FITTED to the dp4-ep4 layout runs these profiles are
    compared with (below); the 2-GPU profiles of 2026-11-29 carry none (dp2-ep2 priced without it), those
    of 2026-11-30, 2026-11-30b and 2026-11-30d carry the same 4-GPU figure (the same host type; fitted to
    the 4-GPU runs with the 2026-11-29 base, not to the 2-GPU points they are compared with; not refitted:
    the 2026-11-30b and 2026-11-30d sources give what the dp2-ep2 run of their engine alone implies, below);
  - intra_node.send_recv: estimated from the measured 2-rank all_gather (a 2-rank all_gather of 2s bytes is
    one send/recv of s bytes per rank), in both the 2- and 4-GPU profiles;
  - intra_node.kind and note of the no-P2P run (NCCL_P2P_DISABLE=1: traffic through host memory);
  - name, description and note_calibration naming these sources (the bench would write
    "h200_sxm_measured" and its own command line).
Every table is `queued_us` of the asynchronous engine's bench (20 ops issued back to back, then one wait),
which is what the bench's --profile-out fits since the NCCL calls return once queued
(docs/benchmarks/planner.md). The synchronous engine's 2-GPU run (time_us, 16:20 UTC) stays in
h200x2_*_nccl_2026-11-29.json, no longer an input. No figure but gpu.host_round_trip_us is fitted to the
layout runs the profiles are compared with.
Run from anywhere: python3 profiles/measured/make_h200xn_epinfer_profiles.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = "profiles/measured/make_h200xn_epinfer_profiles.py"
GRAPH_KERNEL_US = 0.5  # gpu.graph_kernel_us of both bases

# Per base date: one H200, Qwen3-30B-A3B shape, closed loop 128/128, TPOT p50 ms with decode graphs and
# with --no-decode-graphs (same session, docs/benchmarks/planner.md) at C = 1, 8, 64, 256, and that
# engine's kernels per decode step there (planner/engine_facts.h of the time).
ENGINES = {
    # engine 6c868cd: 48 x 23 + 4 below 17 rows, 48 x 28 + 5 above
    "2026-11-29": {"graph_ms": [8.24, 16.44, 26.02, 39.85], "eager_ms": [9.83, 18.00, 28.04, 42.03],
                   "kernels": [1108, 1108, 1349, 1349], "when": ""},
    # engine dc6daa7 + working tree: 48 x 22 + 4 up to 16 rows, 48 x 27 + 5 at 64, 48 x 30 + 5 at 256 (the
    # MoE permute's one-tile CUB sort, 4 kernels, above 1024 picks)
    "2026-11-30": {"graph_ms": [5.60, 13.94, 22.04, 28.96], "eager_ms": [7.00, 15.49, 23.74, 30.59],
                   "kernels": [1060, 1060, 1301, 1445],
                   "when": ", 2026-11-30 05:43-05:46 UTC, commit dc6daa7 + working tree"},
}

# The 2026-11-30e profiles: base date, 2-GPU NCCL file and its run (blocking communicators).
# The 2026-11-30f profiles (4 GPUs): the same base and host figures (fitted on 2 GPUs, not to the 4-GPU runs
# they price), the 4-rank tables of the blocking communicators and the 2-rank tables of the 2026-11-30e run.
BASE_OF = {"2026-11-30e": "2026-11-30d", "2026-11-30f": "2026-11-30d"}
NCCL_FILES_OF_DATE = {"2026-11-30e": "h200x2_{link}_nccl_2026-11-30e.json",
                      "2026-11-30f": "h200x4_{link}_nccl_2026-11-30f.json"}
TWO_FILES_OF_DATE = {"2026-11-30f": "h200x2_{link}_nccl_2026-11-30e.json"}
RUNS_OF_DATE = {"2026-11-30e": "2026-11-30 15:02 UTC on 2 H200 SXM, NV18 NVLink (lent kind nvidia-h200-x2), "
                               "binaries of 5eb5b48 (blocking NCCL communicators, 81d2fcc)",
                "2026-11-30f": "2026-11-30 22:17 UTC (NVLink) and 22:19 UTC (no P2P) on 4 H200 SXM, NV18 NVLink "
                               "between every pair (lent kind nvidia-h200-x4), binaries of 25df76b (blocking "
                               "NCCL communicators)"}
MAX_BYTES_OF_DATE = {"2026-11-30f": "64M"}  # the bench's --max-bytes (default 256M)

# gpu.host_round_trip_us and gpu.host_round_trip_us_per_row of the 2026-11-30e profiles, FITTED to the layout
# runs they are compared with: Qwen3-30B-A3B dp2-ep2 on 2 H200 over NVLink, binaries of 5eb5b48, closed loop
# 128/128, TPOT p50 at C = 1, 8, 64, 256, two runs (2026-11-30 15:04 and 15:08 UTC, docs/benchmarks/
# multi_gpu.md). The plan's closed-loop TPOT is linear in both figures: predicted = P0 + h * DH + r * DR, P0 with
# both at 0, DH the change per us of host_round_trip_us (432 round trips per decode step, 48 MoE layers x 9),
# DR per us of the per-row figure (round trips x the rank's rows, averaged over the closed loop's steps), all
# from epinfer plan --model tests/data/configs/qwen3_30b_a3b.json --hardware <profile with the figures set>
# --gpus 2 --layout dp2-ep2 --input-len 128 --output-len 128 --concurrency 1,8,64,256. Least squares of
# (measured - P0) over the 8 NVLink points. The no-P2P run (15:06 UTC) is not fitted: its points check it.
# P0, DH and DR are the planner of 743a85e, which counted the 9 round trips per MoE layer of that engine; since
# 6dccbb1 the engine uploads its dispatch index once (5 per layer) and the planner counts 5: the figures are
# per round trip and carry over (the first run of that engine, predicted with them: docs/benchmarks/planner.md).
DP2EP2_BLOCKING = {
    "measured_nvlink": [[10.58, 16.21, 27.43, 31.06], [10.80, 16.91, 25.80, 30.85]],
    "measured_no_p2p": [11.60, 18.09, 27.06, 41.88],
    "p0": [5.8841, 9.6739, 15.1274, 17.7451],
    "dh": [0.4320, 0.4320, 0.4320, 0.4320],
    "dr": [0.4320, 1.7280, 17.2766, 75.8313],
}


def blocking_host_fit():
    """(host_round_trip_us, host_round_trip_us_per_row): least squares over the NVLink dp2-ep2 points."""
    f = DP2EP2_BLOCKING
    rows = [(f["dh"][i], f["dr"][i], m[i] - f["p0"][i]) for m in f["measured_nvlink"] for i in range(4)]
    a11 = sum(x * x for x, _, _ in rows)
    a12 = sum(x * z for x, z, _ in rows)
    a22 = sum(z * z for _, z, _ in rows)
    b1 = sum(x * y for x, _, y in rows)
    b2 = sum(z * y for _, z, y in rows)
    det = a11 * a22 - a12 * a12
    return (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det


# gpu.host_round_trip_us of the 4-GPU profiles. Under DP attention the engine makes 9 host round trips per
# MoE layer (planner/engine_facts.h kEngineDpMoeHostRoundTrips: 2 copies of the routing to the host, 2 MPI
# exchanges, 5 uploads), 94 x 9 = 846 per decode step of Qwen3-235B-A22B, so the planner's closed-loop TPOT
# grows by 0.846 ms per us of the figure. Fitted: least squares through the origin of (measured - predicted
# with the figure at 0) TPOT p50 over the 8 dp4-ep4 points (C = 1, 8, 64, 256 on both links), one value for
# both profiles (the host is the same). Measured: docs/benchmarks/multi_gpu.md "Layouts on 4x H200", build
# 01c461a, --memory-fraction 0.95 --kv-cache-tokens 16384. Predicted at 0: epinfer plan --model
# tests/data/configs/qwen3_235b_a22b.json --hardware h200x4_{link}_epinfer_2026-11-29.json --gpus 4
# --layout dp4-ep4 --input-len 128 --output-len 128 --concurrency 1,8,64,256 --kv-cache-dtype fp32 (the
# planner that added the term, its kernels, the engine's fp32 KV then, and this profile with
# host_round_trip_us 0).
DP4EP4_TPOT_MS = {  # link: (measured, predicted at 0) at C = 1, 8, 64, 256
    "nvlink": ([71.97, 92.56, 145.30, 150.20], [62.858, 68.203, 85.164, 96.403]),
    "no_p2p": ([70.18, 94.25, 144.05, 165.13], [62.983, 68.756, 90.221, 107.386]),
}
ROUND_TRIPS_PER_STEP = 94 * 9
HOST_GAPS_MS = [m - p for measured, predicted in DP4EP4_TPOT_MS.values() for m, p in zip(measured, predicted)]
HOST_ROUND_TRIP_US = round(1e3 * sum(HOST_GAPS_MS) / (len(HOST_GAPS_MS) * ROUND_TRIPS_PER_STEP), 1)
PER_POINT_US = [1e3 * g / ROUND_TRIPS_PER_STEP for g in HOST_GAPS_MS]

# What the 2-GPU dp2-ep2 run of a base's engine implies, quoted in that base's 2-GPU sources and not used:
# Qwen3-30B-A3B dp2-ep2 on 2 H200 over NVLink (docs/benchmarks/multi_gpu.md), TPOT p50 at C = 1, 8, 64, 256,
# against epinfer plan --model tests/data/configs/qwen3_30b_a3b.json --hardware
# h200x2_nvlink_epinfer_<date>.json --gpus 2 --layout dp2-ep2 --input-len 128 --output-len 128 --concurrency
# 1,8,64,256 with host_round_trip_us 0 (the planner of the base's day), over 48 x 9 round trips per step.
DP2EP2_RUNS = {  # date: (the run, (measured, predicted at 0))
    "2026-11-30b": ("2026-11-30 12:51 UTC, binaries of ccc87c8",
                    ([23.83, 31.37, 43.88, 48.24], [10.066, 13.635, 18.210, 20.311])),
    "2026-11-30d": ("2026-11-30 13:32 UTC, binaries of 04be258",
                    ([19.70, 27.91, 41.55, 47.30], [9.136, 12.664, 17.867, 19.833])),
}
DP2EP2_ROUND_TRIPS_PER_STEP = 48 * 9


def dp2ep2_quote(date):
    """What the dp2-ep2 run of the base's engine implies per round trip, quoted in host_round_trip_us's
    source: per point and the least squares through the origin."""
    run, (measured, predicted) = DP2EP2_RUNS[date]
    gaps_ms = [m - p for m, p in zip(measured, predicted)]
    per_point_us = [1e3 * g / DP2EP2_ROUND_TRIPS_PER_STEP for g in gaps_ms]
    fit_us = 1e3 * sum(gaps_ms) / (len(gaps_ms) * DP2EP2_ROUND_TRIPS_PER_STEP)
    return (f"; the dp2-ep2 run of this base's engine ({run}, NVLink) against this profile's plan with the "
            "figure at 0 implies " + " / ".join(f"{u:.1f}" for u in per_point_us) + " us at C = 1 / 8 / 64 / "
            f"256 over {DP2EP2_ROUND_TRIPS_PER_STEP} round trips per step (least squares {fit_us:.1f} us), "
            "quoted, not used")


def eager_fit(date):
    """gpu.eager_kernel_us and its source: graph_kernel_us + the least squares through the origin of
    (eager - graph) = extra x kernels over the four pairs of the base's engine."""
    e = ENGINES[date]
    extra = (1e3 * sum((x - g) * k for x, g, k in zip(e["eager_ms"], e["graph_ms"], e["kernels"])) /
             sum(k * k for k in e["kernels"]))
    gaps = " / ".join(f"{x - g:.2f}" for x, g in zip(e["eager_ms"], e["graph_ms"]))
    kernels = " / ".join(str(k) for k in e["kernels"])
    source = (f"one H200, Qwen3-30B-A3B shape, closed loop 128/128{e['when']} (docs/benchmarks/planner.md): "
              f"TPOT with --no-decode-graphs minus with decode graphs, {gaps} ms at C = 1 / 8 / 64 / 256 over "
              f"{kernels} kernels per step: least squares through the origin {extra:.3f} us per kernel more "
              f"than graph_kernel_us 0.5 ({SCRIPT})")
    return round(GRAPH_KERNEL_US + extra, 2), source


NVLINK_NOTE = ("NV18 NVLink between the {n} H200s of the lent host; NCCL 2.28, NVLS off. all_reduce, "
               "all_gather, all_to_all measured by epinfer bench comm --device cuda (sources in each figure).")
NO_P2P_NOTE = ("The same {n} NVLink-connected H200s with NCCL_P2P_DISABLE=1: NCCL stages every transfer "
               "through host memory ({busbw} GB/s all_reduce busbw at 256 MiB), a stand-in for PCIe GPUs "
               "without peer access. all_reduce, all_gather, all_to_all measured by epinfer bench comm "
               "--device cuda (sources in each figure).")
NUMBER = {2: "Two", 4: "Four"}

# The bench's --profile-out files (profiles/measured/), per GPU count.
NCCL_FILES = {2: "h200x2_{link}_nccl_queued_2026-11-29.json", 4: "h200x4_{link}_nccl_2026-11-29.json"}
RUNS = {2: "2026-11-29 20:39 UTC on 2 H200 SXM, NV18 NVLink (lent kind nvidia-h200-x2)",
        4: "2026-11-29 20:12 UTC on 4 H200 SXM, NV18 NVLink between every pair (lent kind nvidia-h200-x4)"}
SETUPS = [(2, "nvlink", "2026-11-29"), (2, "no_p2p", "2026-11-29"), (4, "nvlink", "2026-11-29"),
          (4, "no_p2p", "2026-11-29"), (2, "nvlink", "2026-11-30"), (2, "no_p2p", "2026-11-30"),
          (2, "nvlink", "2026-11-30b"), (2, "no_p2p", "2026-11-30b"), (2, "nvlink", "2026-11-30d"),
          (2, "no_p2p", "2026-11-30d"), (2, "nvlink", "2026-11-30e"), (2, "no_p2p", "2026-11-30e"),
          (4, "nvlink", "2026-11-30f"), (4, "no_p2p", "2026-11-30f")]


def figure(value, provenance, source):
    return {"value": value, "provenance": provenance, "source": source}


def send_recv_from_all_gather(all_gather, what):
    """A send of s bytes between two ranks as the measured 2-rank all_gather of 2s bytes."""
    (table,) = [t for t in all_gather["tables"] if t["ranks"] == 2]
    points = [[size / 2, time] for size, time in table["points"]]
    source = ("estimate: a 2-rank all_gather of 2s bytes is one send/recv of s bytes per rank; the measured "
              "2-rank intra_node.all_gather of " + what)
    return {
        "latency_us": figure(all_gather["latency_us"]["value"], "estimate", source + " (its fitted latency)"),
        "bus_bandwidth_gbps": figure(all_gather["bus_bandwidth_gbps"]["value"], "estimate",
                                     source + " (its fitted busbw: the per-rank transfer rate)"),
        "tables": [{"ranks": 2, "points": points, "provenance": "estimate", "source": source + ", sizes halved"}],
    }


def all_reduce_busbw_at_largest(all_reduce, ranks):
    """nccl-tests busbw (GB/s) of the largest measured all_reduce: size / time x 2(n - 1)/n."""
    (table,) = [t for t in all_reduce["tables"] if t["ranks"] == ranks]
    size, time_us = table["points"][-1]
    return size / (time_us * 1e3) * 2.0 * (ranks - 1) / ranks


def load(name):
    with open(os.path.join(HERE, name)) as f:
        return json.load(f)


def make(gpus, link, date):
    nccl_file = NCCL_FILES_OF_DATE.get(date, NCCL_FILES[gpus]).format(link=link)
    two_file = TWO_FILES_OF_DATE.get(date, nccl_file if date in NCCL_FILES_OF_DATE else NCCL_FILES[2]).format(
        link=link)
    run = RUNS_OF_DATE.get(date, RUNS[gpus])
    two_run = RUNS_OF_DATE["2026-11-30e"] if date in TWO_FILES_OF_DATE else RUNS[2]
    out_file = f"h200x{gpus}_{link}_epinfer_{date}.json"
    base = f"profiles/measured/h200_epinfer_{BASE_OF.get(date, date)}.json"
    doc = load(os.path.basename(base))
    base_note = doc["note_calibration"]
    nccl = load(nccl_file)
    two = load(two_file)
    gpu = doc["gpu"]
    if date in ENGINES:
        eager_kernel_us, eager_source = eager_fit(date)
        gpu["eager_kernel_us"] = figure(eager_kernel_us, "measured", eager_source)
    if date in BASE_OF:
        h, r = blocking_host_fit()
        f = DP2EP2_BLOCKING
        fitted_to = ("FITTED to the layout runs it is compared with" if gpus == 2 else
                     "FITTED on 2 GPUs, not to the 4-GPU runs this profile prices (the 2026-11-30e profiles' "
                     "figure)")
        where = (fitted_to + ": Qwen3-30B-A3B dp2-ep2 on 2 H200 over NVLink, "
                 "binaries of 5eb5b48 (blocking NCCL communicators), closed loop 128/128, TPOT p50 at C = 1, 8, "
                 "64, 256, two runs (" + "; ".join(" / ".join(f"{v:.2f}" for v in m) for m in f["measured_nvlink"])
                 + " ms; docs/benchmarks/multi_gpu.md): least squares of measured minus the plan with both host "
                 "figures at 0 (" + " / ".join(f"{v:.2f}" for v in f["p0"]) + " ms), the plan linear in "
                 "host_round_trip_us (432 round trips per step) and host_round_trip_us_per_row (round trips x "
                 "the rank's rows). The no-P2P run of the same build is not fitted (its check: "
                 "docs/benchmarks/planner.md)")
        gpu["host_round_trip_us"] = figure(round(h, 1), "estimate", f"{where}: {h:.2f} us ({SCRIPT})")
        gpu["host_round_trip_us_per_row"] = figure(
            round(r, 3), "estimate",
            f"{where}: {r:.4f} us per row per round trip ({SCRIPT}). Cross-check, not fitted: `epinfer bench ep "
            "--device cuda --tokens 1,8,64,128 --hidden 2048 --experts 128 --top-k 8` on the same 2 H200 over "
            "NVLink spent 155 us in a dispatch and a combine at 1 token per rank and 199 us at 128 (0.35 us "
            "more per token): the host's time grows with the rows, less than the engine's MoE layer, which "
            "also copies the routing to the host and uploads the received rows' slots and weights")
    elif gpus == 2 and date != "2026-11-29":
        two_gpu_run = dp2ep2_quote(date) if date in DP2EP2_RUNS else ""
        gpu["host_round_trip_us"] = figure(
            HOST_ROUND_TRIP_US, "estimate",
            f"the 4-GPU profiles' figure (h200x4_*_epinfer_2026-11-29.json), fitted there to the Qwen3-235B-A22B "
            f"dp4-ep4 runs on 4 H200 of the same host type (build 01c461a, docs/benchmarks/multi_gpu.md): least "
            f"squares through the origin of TPOT p50 measured minus predicted with the figure at 0 over "
            f"{ROUND_TRIPS_PER_STEP} host round trips per step, {HOST_ROUND_TRIP_US} us. Not fitted to the 2-GPU "
            "runs this profile prices (dp2-ep2 of docs/benchmarks/multi_gpu.md, 2026-11-30); the 4-GPU points "
            f"alone imply {min(PER_POINT_US):.0f}-{max(PER_POINT_US):.0f} us, growing with the step's rows"
            f"{two_gpu_run} ({SCRIPT})")
    if gpus == 4 and date not in BASE_OF:
        gpu["host_round_trip_us"] = figure(
            HOST_ROUND_TRIP_US, "estimate",
            "fitted to the layout runs it is compared with: Qwen3-235B-A22B dp4-ep4 on 4 H200 (build 01c461a, "
            "docs/benchmarks/multi_gpu.md), closed loop 128/128, TPOT p50 measured minus predicted with this "
            "figure at 0, at C = 1, 8, 64, 256 with NVLink and without P2P (8 points, both 4-GPU profiles), over "
            f"{ROUND_TRIPS_PER_STEP} host round trips per step (94 MoE layers x 9, planner/engine_facts.h): "
            f"least squares through the origin {HOST_ROUND_TRIP_US} us. The points alone imply "
            + " / ".join(f"{u:.0f}" for u in PER_POINT_US[:4]) + " us (NVLink) and "
            + " / ".join(f"{u:.0f}" for u in PER_POINT_US[4:]) + " us (no P2P) at C = 1 / 8 / 64 / 256: "
            "the host's time per round trip grows with the step's rows, which one figure does not follow. "
            "Cross-check, not fitted: `epinfer bench ep` on 2 H200 over NVLink at 128 tokens "
            "(docs/benchmarks/multi_gpu.md) spent 94 us over the bare all-to-all in the dispatch (3 round "
            f"trips and a gather) and 103 us in the combine (2 round trips and 3 kernels) ({SCRIPT})")
    intra = doc["intra_node"]
    for c in ("all_reduce", "all_gather", "all_to_all"):
        intra[c] = nccl["intra_node"][c]
        assert [t["ranks"] for t in intra[c]["tables"]] == [gpus], (nccl_file, c)
        if gpus != 2:
            (table,) = two["intra_node"][c]["tables"]
            assert table["ranks"] == 2, (two_file, c)
            table = dict(table, source=(
                f"measured {two_run}, a host of the same H200 SXM NV18 type as this profile's {gpus} GPUs "
                f"({RUNS[gpus]}), the same NCCL settings (profiles/measured/{two_file}): " + table["source"]))
            intra[c]["tables"] = [table] + intra[c]["tables"]
    intra["send_recv"] = send_recv_from_all_gather(two["intra_node"]["all_gather"], two_file)
    if link == "nvlink":
        intra["kind"] = "nvlink"
        intra["note"] = NVLINK_NOTE.format(n=gpus)
        description = (f"{NUMBER[gpus]} NVIDIA H200 SXM as epinfer uses them: the one-GPU engine calibration "
                       f"(h200_epinfer_{BASE_OF.get(date, date)}) with the collectives measured on {gpus} H200s "
                       f"linked by NV18 NVLink (NCCL 2.28, NVLS off), {run[:10]}")
    else:
        intra["kind"] = "pcie_no_p2p"
        busbw = all_reduce_busbw_at_largest(nccl["intra_node"]["all_reduce"], gpus)
        intra["note"] = NO_P2P_NOTE.format(n=gpus, busbw=f"{busbw:.0f}")
        description = (f"{NUMBER[gpus]} NVIDIA H200 SXM as epinfer uses them with NCCL_P2P_DISABLE=1 (traffic "
                       "through host memory: a stand-in for PCIe boxes without P2P): the one-GPU engine "
                       f"calibration (h200_epinfer_{BASE_OF.get(date, date)}) with the collectives measured that "
                       f"way, {run[:10]}")
    if gpus != 2:
        description += ("; 2-rank tables (for 2-rank groups) from 2 H200 SXM of a 2-GPU host of the same NV18 "
                        "type, the same link setting")
    doc["name"] = os.path.splitext(out_file)[0]
    doc["description"] = description
    host_note = ("" if gpus == 2 and date == "2026-11-29" else
                 ", gpu.host_round_trip_us and gpu.host_round_trip_us_per_row fitted to the dp2-ep2 runs over "
                 "NVLink of docs/benchmarks/multi_gpu.md as their sources say" if date in BASE_OF else
                 ", gpu.host_round_trip_us fitted to the dp4-ep4 runs of docs/benchmarks/multi_gpu.md as its "
                 "source says")
    two_note = ("" if gpus == 2 else
                f" and the 2-rank tables of profiles/measured/{two_file} ({two_run}: the same machine type) "
                "before each 4-rank one")
    eager_note = ("fitted as its source says" if date in ENGINES else
                  "the base's (not re-measured for its engine, as its source says)")
    doc["note_calibration"] = (
        f"{base} (gpu.* of the one-GPU engine calibration, its own note below) with "
        f"intra_node.all_reduce, intra_node.all_gather, intra_node.all_to_all of profiles/measured/{nccl_file} "
        f"(what `epinfer bench comm --device cuda --ranks {gpus} --min-bytes 1K --max-bytes "
        f"{MAX_BYTES_OF_DATE.get(date, '256M')} --iters 20 "
        f"--profile-out OUT --base-profile {base}` writes from those measurements, {run}: queued_us, per "
        "op of 20 ops issued back to back and waited for once, of the engine whose NCCL calls return once "
        f"queued){two_note}, intra_node.send_recv estimated from the 2-rank all_gather, gpu.eager_kernel_us "
        f"{eager_note}{host_note}; written by {SCRIPT}")
    doc["note_calibration_base"] = base_note
    with open(os.path.join(HERE, out_file), "w") as f:
        f.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    for setup in SETUPS:
        make(*setup)
