#!/usr/bin/env python3
"""Writes h200x2_nvlink_epinfer_2026-11-29.json and h200x2_no_p2p_epinfer_2026-11-29.json (this folder).

Each is what `epinfer bench comm --device cuda --ranks 2 ... --profile-out OUT --base-profile
profiles/measured/h200_epinfer_2026-11-29.json` writes (planner/calibration.h calibrated_profile_json):
the one-GPU engine calibration (gpu.*) with intra_node.{all_reduce, all_gather, all_to_all} replaced by
the 2x H200 measurements of h200x2_{nvlink,no_p2p}_nccl_2026-11-29.json (copied verbatim: the same
points give the same least-squares fit), plus what the bench does not measure:
  - gpu.eager_kernel_us: fitted to the one-GPU --no-decode-graphs runs (below);
  - gpu.collective_sync_us: fitted to the 2x H200 layout runs (docs/benchmarks/planner.md, section
    "2x H200, Qwen3-30B-A3B, layouts"), one value for both link settings;
  - intra_node.send_recv: estimated from the measured 2-rank all_gather (each rank sends half the output
    to the other: a send of s bytes ~ an all_gather of 2s);
  - intra_node.kind and note of the no-P2P run (NCCL_P2P_DISABLE=1: traffic through host memory);
  - name, description and note_calibration naming these sources (the bench would write
    "h200_sxm_measured" and its own command line).
Run from anywhere: python3 profiles/measured/make_h200x2_epinfer_profiles.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = "profiles/measured/h200_epinfer_2026-11-29.json"

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

# Fitted with `epinfer plan` to the tp2 and ep2 runs of both link settings at C = 1, 8, 64 (12 points, 96
# collectives per step each): least squares through the origin of (measured TPOT - predicted TPOT with
# collective_sync_us = 0) over the calls per step (docs/benchmarks/planner.md, "2x H200 ... layouts").
COLLECTIVE_SYNC_US = 22.0
SYNC_SOURCE = (
    "2x H200, Qwen3-30B-A3B shape, closed loop 128/128, tp2 and ep2 with NVLink and with "
    "NCCL_P2P_DISABLE=1, 2026-11-29 (docs/benchmarks/planner.md, '2x H200, Qwen3-30B-A3B, layouts'): least "
    "squares through the origin of measured TPOT minus the plan's TPOT without this term, over the 96 "
    "synchronous all-reduces per step, at C = 1, 8, 64 (12 points; C = 256, 1024 left out: there the one-GPU "
    "calibration itself predicts 16-33 % less TPOT than measured): 22.2 us per call. The points alone imply "
    "15-24 us at C = 1, 1-4 us at C = 8 and 31-69 us at C = 64: one constant is a compromise, not a law")


def figure(value, provenance, source):
    return {"value": value, "provenance": provenance, "source": source}


def send_recv_from_all_gather(all_gather, what):
    points = [[size / 2.0, time] for size, time in all_gather["table"]["points"]]
    source = ("estimate: a 2-rank all_gather of 2s bytes is one send/recv of s bytes per rank; the measured "
              "intra_node.all_gather of " + what)
    return {
        "latency_us": figure(all_gather["latency_us"]["value"], "estimate", source + " (its fitted latency)"),
        "bus_bandwidth_gbps": figure(all_gather["bus_bandwidth_gbps"]["value"], "estimate",
                                     source + " (its fitted busbw: the per-rank transfer rate)"),
        "table": {"ranks": 2, "points": points, "provenance": "estimate",
                  "source": source + ", sizes halved"},
    }


def make(nccl_file, out_file, description, kind, note, sync_us, sync_source):
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
        f"{EXTRA_US:.3f} us per kernel more than graph_kernel_us 0.5 "
        "(profiles/measured/make_h200x2_epinfer_profiles.py)")
    gpu["collective_sync_us"] = figure(sync_us, "measured", sync_source)
    intra = doc["intra_node"]
    for c in ("all_reduce", "all_gather", "all_to_all"):
        intra[c] = nccl["intra_node"][c]
    intra["send_recv"] = send_recv_from_all_gather(nccl["intra_node"]["all_gather"], nccl_file)
    intra["kind"] = kind
    intra["note"] = note
    doc["name"] = os.path.splitext(out_file)[0]
    doc["description"] = description
    doc["note_calibration"] = (
        f"{BASE} (gpu.* of the one-GPU engine calibration, its own note below) with "
        f"intra_node.all_reduce, intra_node.all_gather, intra_node.all_to_all of profiles/measured/{nccl_file} "
        "(what `epinfer bench comm --device cuda --ranks 2 --min-bytes 1K --max-bytes 256M --iters 20 "
        f"--profile-out OUT --base-profile {BASE}` writes from those measurements), intra_node.send_recv "
        "estimated from the all_gather, gpu.eager_kernel_us and gpu.collective_sync_us fitted as their sources "
        "say; written by profiles/measured/make_h200x2_epinfer_profiles.py")
    doc["note_calibration_base"] = base_note
    with open(os.path.join(HERE, out_file), "w") as f:
        f.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    import sys
    # An optional argument overrides collective_sync_us (to refit: run the plan at 0 and at another value).
    sync = float(sys.argv[1]) if len(sys.argv) > 1 else COLLECTIVE_SYNC_US
    sync_source = SYNC_SOURCE if len(sys.argv) == 1 else "refit in progress: set by hand"
    make("h200x2_nvlink_nccl_2026-11-29.json", "h200x2_nvlink_epinfer_2026-11-29.json",
         "Two NVIDIA H200 SXM as epinfer uses them: the one-GPU engine calibration (h200_epinfer_2026-11-29) "
         "with the collectives measured on 2 H200s linked by NV18 NVLink (NCCL 2.28, NVLS off), 2026-11-29",
         "nvlink",
         "NV18 NVLink between the 2 H200s of the lent host; NCCL 2.28, NVLS off. all_reduce, all_gather, "
         "all_to_all measured by epinfer bench comm --device cuda (sources in each figure).",
         sync, sync_source)
    make("h200x2_no_p2p_nccl_2026-11-29.json", "h200x2_no_p2p_epinfer_2026-11-29.json",
         "Two NVIDIA H200 SXM as epinfer uses them with NCCL_P2P_DISABLE=1 (traffic through host memory: a "
         "stand-in for PCIe boxes without P2P): the one-GPU engine calibration (h200_epinfer_2026-11-29) with "
         "the collectives measured that way, 2026-11-29",
         "pcie_no_p2p",
         "The same 2 NVLink-connected H200s with NCCL_P2P_DISABLE=1: NCCL stages every transfer through "
         "host memory (26 GB/s all_reduce busbw at 256 MiB), a stand-in for PCIe GPUs without peer access. "
         "all_reduce, all_gather, all_to_all measured by epinfer bench comm --device cuda (sources in each "
         "figure).",
         sync, sync_source)
