#!/usr/bin/env python3
"""Writes the engine-calibrated multi-GPU H200 profiles of this folder:
  h200x2_nvlink_epinfer_2026-11-29.json, h200x2_no_p2p_epinfer_2026-11-29.json (2 H200s),
  h200x4_nvlink_epinfer_2026-11-29.json, h200x4_no_p2p_epinfer_2026-11-29.json (4 H200s).

Each is what `epinfer bench comm --device cuda --ranks N ... --profile-out OUT --base-profile
profiles/measured/h200_epinfer_2026-11-29.json` writes (planner/calibration.h calibrated_profile_json):
the one-GPU engine calibration (gpu.*) with intra_node.{all_reduce, all_gather, all_to_all} replaced by
the N x H200 measurements of h200xN_{nvlink,no_p2p}_nccl_2026-11-29.json (the bench's --profile-out of
that run, copied verbatim: the same points give the same least-squares fit), plus what the bench does not
measure:
  - gpu.eager_kernel_us: fitted to the one-GPU --no-decode-graphs runs (below);
  - intra_node.send_recv: estimated from the measured N-rank all_gather (each rank's block of size/N goes
    to every other rank: a send of s bytes ~ an all_gather of N*s, its bandwidth shared by the N - 1
    peers; exact in form at N = 2);
  - intra_node.kind and note of the no-P2P run (NCCL_P2P_DISABLE=1: traffic through host memory);
  - name, description and note_calibration naming these sources (the bench would write
    "h200_sxm_measured" and its own command line).
The 2-GPU tables are `time_us` of the synchronous engine's bench (one op from a barrier to its end, the
host polling it); the 4-GPU tables `queued_us` of the asynchronous one (20 ops back to back, then one
wait), which is what the bench's --profile-out fits since the NCCL calls return once queued
(docs/benchmarks/planner.md). No figure is fitted to the layout runs the profiles are compared with.
Run from anywhere: python3 profiles/measured/make_h200xn_epinfer_profiles.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = "profiles/measured/h200_epinfer_2026-11-29.json"
SCRIPT = "profiles/measured/make_h200xn_epinfer_profiles.py"

# One H200, Qwen3-30B-A3B shape, closed loop 128/128, TPOT p50 ms with decode graphs and with
# --no-decode-graphs (same session, docs/benchmarks/planner.md) at C = 1, 8, 64, 256, and the engine's
# kernels per decode step there (planner/engine_facts.h: 48 x 23 + 4 below 17 rows, 48 x 28 + 5 above).
GRAPH_MS = [8.24, 16.44, 26.02, 39.85]
EAGER_MS = [9.83, 18.00, 28.04, 42.03]
KERNELS = [1108, 1108, 1349, 1349]
GRAPH_KERNEL_US = 0.5  # gpu.graph_kernel_us of the base

# Least squares through the origin of (eager - graph) = extra x kernels.
EXTRA_US = (1e3 * sum((e - g) * k for e, g, k in zip(EAGER_MS, GRAPH_MS, KERNELS)) /
            sum(k * k for k in KERNELS))
EAGER_KERNEL_US = round(GRAPH_KERNEL_US + EXTRA_US, 2)

NVLINK_NOTE = ("NV18 NVLink between the {n} H200s of the lent host; NCCL 2.28, NVLS off. all_reduce, "
               "all_gather, all_to_all measured by epinfer bench comm --device cuda (sources in each figure).")
NO_P2P_NOTE = ("The same {n} NVLink-connected H200s with NCCL_P2P_DISABLE=1: NCCL stages every transfer "
               "through host memory ({busbw} GB/s all_reduce busbw at 256 MiB), a stand-in for PCIe GPUs "
               "without peer access. all_reduce, all_gather, all_to_all measured by epinfer bench comm "
               "--device cuda (sources in each figure).")
NUMBER = {2: "Two", 4: "Four"}

# (GPUs, link, what the bench's tables are).
SETUPS = [
    (2, "nvlink", "time_us"),
    (2, "no_p2p", "time_us"),
    (4, "nvlink", "queued_us"),
    (4, "no_p2p", "queued_us"),
]


def figure(value, provenance, source):
    return {"value": value, "provenance": provenance, "source": source}


def send_recv_from_all_gather(all_gather, ranks, what):
    """A send of s bytes between two ranks as the measured `ranks`-rank all_gather of ranks*s bytes."""
    points = [[size / ranks, time] for size, time in all_gather["table"]["points"]]
    if ranks == 2:
        source = ("estimate: a 2-rank all_gather of 2s bytes is one send/recv of s bytes per rank; the measured "
                  "intra_node.all_gather of " + what)
        bw_note = " (its fitted busbw: the per-rank transfer rate)"
    else:
        source = (f"estimate: in a {ranks}-rank all_gather of {ranks}s bytes each rank sends its s bytes to each "
                  f"of the {ranks - 1} others, so one send/recv of s bytes takes about its time (an upper bound: "
                  f"the {ranks - 1} transfers share the rank's links); the measured intra_node.all_gather of "
                  + what)
        bw_note = f" (its fitted busbw / {ranks - 1}: one peer's share of the rank's rate)"
    table_note = ", sizes halved" if ranks == 2 else f", sizes divided by {ranks}"
    return {
        "latency_us": figure(all_gather["latency_us"]["value"], "estimate", source + " (its fitted latency)"),
        "bus_bandwidth_gbps": figure(all_gather["bus_bandwidth_gbps"]["value"] / (ranks - 1), "estimate",
                                     source + bw_note),
        "table": {"ranks": 2, "points": points, "provenance": "estimate",
                  "source": source + table_note},
    }


def all_reduce_busbw_at_largest(all_reduce, ranks):
    """nccl-tests busbw (GB/s) of the largest measured all_reduce: size / time x 2(n - 1)/n."""
    size, time_us = all_reduce["table"]["points"][-1]
    return size / (time_us * 1e3) * 2.0 * (ranks - 1) / ranks


def make(gpus, link, timing):
    nccl_file = f"h200x{gpus}_{link}_nccl_2026-11-29.json"
    out_file = f"h200x{gpus}_{link}_epinfer_2026-11-29.json"
    with open(os.path.join(HERE, "h200_epinfer_2026-11-29.json")) as f:
        doc = json.load(f)
    base_note = doc["note_calibration"]
    with open(os.path.join(HERE, nccl_file)) as f:
        nccl = json.load(f)
    gpu = doc["gpu"]
    gpu["eager_kernel_us"] = figure(
        EAGER_KERNEL_US, "measured",
        "one H200, Qwen3-30B-A3B shape, closed loop 128/128 (docs/benchmarks/planner.md): TPOT with "
        "--no-decode-graphs minus with decode graphs, 1.59 / 1.56 / 2.02 / 2.18 ms at C = 1 / 8 / 64 / 256 "
        "over 1108 / 1108 / 1349 / 1349 kernels per step: least squares through the origin "
        f"{EXTRA_US:.3f} us per kernel more than graph_kernel_us 0.5 ({SCRIPT})")
    intra = doc["intra_node"]
    for c in ("all_reduce", "all_gather", "all_to_all"):
        intra[c] = nccl["intra_node"][c]
        assert intra[c]["table"]["ranks"] == gpus, (nccl_file, c)
    intra["send_recv"] = send_recv_from_all_gather(nccl["intra_node"]["all_gather"], gpus, nccl_file)
    if link == "nvlink":
        intra["kind"] = "nvlink"
        intra["note"] = NVLINK_NOTE.format(n=gpus)
        description = (f"{NUMBER[gpus]} NVIDIA H200 SXM as epinfer uses them: the one-GPU engine calibration "
                       f"(h200_epinfer_2026-11-29) with the collectives measured on {gpus} H200s linked by NV18 "
                       "NVLink (NCCL 2.28, NVLS off), 2026-11-29")
    else:
        intra["kind"] = "pcie_no_p2p"
        busbw = all_reduce_busbw_at_largest(nccl["intra_node"]["all_reduce"], gpus)
        intra["note"] = NO_P2P_NOTE.format(n=gpus, busbw=f"{busbw:.0f}")
        description = (f"{NUMBER[gpus]} NVIDIA H200 SXM as epinfer uses them with NCCL_P2P_DISABLE=1 (traffic "
                       "through host memory: a stand-in for PCIe boxes without P2P): the one-GPU engine "
                       "calibration (h200_epinfer_2026-11-29) with the collectives measured that way, 2026-11-29")
    doc["name"] = os.path.splitext(out_file)[0]
    doc["description"] = description
    timing_note = (
        "time_us, one op from a barrier to its end, of the engine whose NCCL calls were synchronous"
        if timing == "time_us" else
        "queued_us, per op of 20 ops issued back to back and waited for once, of the engine whose NCCL calls "
        "return once queued")
    doc["note_calibration"] = (
        f"{BASE} (gpu.* of the one-GPU engine calibration, its own note below) with "
        f"intra_node.all_reduce, intra_node.all_gather, intra_node.all_to_all of profiles/measured/{nccl_file} "
        f"(what `epinfer bench comm --device cuda --ranks {gpus} --min-bytes 1K --max-bytes 256M --iters 20 "
        f"--profile-out OUT --base-profile {BASE}` writes from those measurements: {timing_note}), "
        "intra_node.send_recv estimated from the all_gather, gpu.eager_kernel_us fitted as its source says; "
        f"written by {SCRIPT}")
    doc["note_calibration_base"] = base_note
    with open(os.path.join(HERE, out_file), "w") as f:
        f.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    for setup in SETUPS:
        make(*setup)
