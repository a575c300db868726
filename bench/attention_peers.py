#!/usr/bin/env python3
"""PyTorch peers of `epinfer bench attention`: the same cases through scaled_dot_product_attention, in bf16.

Reads the JSON that `epinfer bench attention --json FILE` wrote, and for every case times
torch.nn.functional.scaled_dot_product_attention with each of two backends, chosen with
torch.nn.attention.sdpa_kernel:

  flash  SDPBackend.FLASH_ATTENTION
  cudnn  SDPBackend.CUDNN_ATTENTION

on random bf16 tensors (uniform in [-1, 1), never zeros) of the case's shape:

  decode   q [B, Nh, 1, Dqk]; K [B, Nkv, S, Dqk], V [B, Nkv, S, Dv] contiguous (no paging), not causal
           (the one query token sits at position S - 1 and sees every key);
  prefill  q [1, Nh, T, Dqk]; K, V [1, Nkv, T, D]; is_causal=True.

GQA: K and V keep their Nkv heads (never repeated to Nh, which would read Nh/Nkv times the bytes): first
with enable_gqa=True; a backend that refuses that is tried once more with the Nkv heads as given and no
flag (cuDNN takes Nh a multiple of Nkv natively). The `gqa` field of each result says which call ran. A
backend that refuses both is reported as "n/a" with the first line of its reason.

Timing as epinfer's: CUDA events around each call, a 512 MiB L2 flush before each, median of --repeats after
warm-ups. SOL as the issue defines it: decode on the bf16 KV bytes (epinfer's kv_bytes_bf16, which the peers
read as such) at 4.8 TB/s, prefill on the causal FLOPs at 989 TFLOP/s. The table gives, per peer, its time
(SOL) and epinfer's speedup over it (peer time / epinfer time: below 1, epinfer is slower).

  epinfer bench attention --json attn.json
  python3 bench/attention_peers.py --epinfer-json attn.json --out-json attn_peers.json --out-md attn_peers.md
"""
import argparse
import json
import math
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from moe_peers import time_us  # the same event timing with an L2 flush

PEAK_BYTES_PER_S = 4.8e12
PEAK_FLOPS_PER_S = 989e12
FLUSH_BYTES = 512 << 20
PEERS = (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION))


def inputs(row, dev, gen):
    """q, k, v in SDPA's [batch, heads, tokens, dim] layout, bf16, and is_causal."""
    nh, nkv, dqk, dv = row["num_heads"], row["num_kv_heads"], row["head_dim_qk"], row["head_dim_v"]
    if row["phase"] == "decode":
        b, tq, s, causal = row["batch"], 1, row["context"], False
    else:
        b, tq, s, causal = 1, row["context"], row["context"], True

    def rand(*shape):
        return torch.rand(*shape, device=dev, generator=gen, dtype=torch.bfloat16).mul_(2).sub_(1)

    return rand(b, nh, tq, dqk), rand(b, nkv, s, dqk), rand(b, nkv, s, dv), causal


def reason_of(exc, caught):
    """First line of the refusal, with the backend's own warning when it gave one."""
    why = [str(w.message).splitlines()[0] for w in caught if str(w.message).strip()]
    text = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ("; ".join(why[:2] + [text]))[:300]


def run_peer(backend, q, k, v, causal, scale, repeats, flush):
    """(time_us, gqa mode, None) or (None, None, reason)."""
    reasons = []
    for mode, kwargs in (("enable_gqa", {"enable_gqa": True}), ("kv heads as given", {})):
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **kwargs)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    call()
                    torch.cuda.synchronize()
                except Exception as exc:  # a refusal: try the next call, report if none runs
                    reasons.append(f"{mode}: {reason_of(exc, caught)}")
                    continue
            return time_us(call, repeats, flush, warmups=3), mode, None
        except Exception as exc:  # failed while timing
            reasons.append(f"{mode}: {reason_of(exc, [])}")
    return None, None, " | ".join(reasons)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epinfer-json", required=True, help="output of `epinfer bench attention --json`")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out-json", help="merged results")
    ap.add_argument("--out-md", help="merged table, markdown")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: must be at least 1")

    with open(args.epinfer_json) as f:
        doc = json.load(f)
    if doc.get("bench") != "attention":
        ap.error(f"--epinfer-json {args.epinfer_json}: not the output of `epinfer bench attention --json`")
    dev = torch.device("cuda")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)
    print(f"PyTorch {torch.__version__} (cuDNN {torch.backends.cudnn.version()}) on "
          f"{torch.cuda.get_device_name(0)}; epinfer: {doc['gpu']}", flush=True)

    merged = []
    for r in doc["rows"]:
        gen = torch.Generator(device=dev).manual_seed(1234)
        q, k, v, causal = inputs(r, dev, gen)
        scale = 1.0 / math.sqrt(r["head_dim_qk"])
        decode = r["phase"] == "decode"
        out = dict(r)
        for name, backend in PEERS:
            us, mode, reason = run_peer(backend, q, k, v, causal, scale, args.repeats, flush)
            out[f"{name}_us"] = us
            out[f"{name}_gqa"] = mode
            out[f"{name}_error"] = reason
            if us:
                out[f"{name}_sol"] = (r["kv_bytes_bf16"] / PEAK_BYTES_PER_S if decode
                                      else r["flops"] / PEAK_FLOPS_PER_S) / (us * 1e-6)
                out[f"speedup_vs_{name}"] = us / r["time_us"]
            else:
                out[f"{name}_sol"] = None
                out[f"speedup_vs_{name}"] = None
        merged.append(out)
        fmt = lambda v, spec: ("n/a" if v is None else format(v, spec))
        print(f"{r['shape']:<14} {r['phase']:<7} B={r['batch']:<3} ctx={r['context']:<6} "
              f"epinfer {r['time_us']:>10.1f} us  flash {fmt(out['flash_us'], '>9.1f')}  "
              f"cudnn {fmt(out['cudnn_us'], '>9.1f')}", flush=True)
        for name, _ in PEERS:
            if out[f"{name}_error"] and out[f"{name}_us"] is None:
                print(f"  {name} n/a: {out[f'{name}_error']}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()

    kv = doc.get("kv_dtype", "fp32")
    header = (f"| shape | phase | Nh/Nkv×D | B | context | SOL on | epinfer {kv} KV µs (SOL) | flash bf16 µs (SOL) | "
              "cuDNN bf16 µs (SOL) | speedup vs flash | speedup vs cuDNN |")
    lines = [header, "|" + "---|" * 11]
    notes = []
    for m in merged:
        def cell(name):
            if m[f"{name}_us"] is None:
                notes.append(f"{m['shape']} {m['phase']} B={m['batch']} context={m['context']}, {name}: "
                             f"{m[f'{name}_error']}")
                return "n/a"
            return f"{m[f'{name}_us']:.1f} ({m[f'{name}_sol']:.2f})"

        def ratio(name):
            v = m[f"speedup_vs_{name}"]
            return "n/a" if v is None else f"{v:.2f}"

        decode = m["phase"] == "decode"
        lines.append(
            f"| {m['shape']} | {m['phase']} | {m['num_heads']}/{m['num_kv_heads']}×{m['head_dim_qk']} | "
            f"{m['batch']} | {m['context']} | {'bf16 KV bytes' if decode else 'causal FLOPs'} | "
            f"{m['time_us']:.1f} ({m['sol']:.2f}) | {cell('flash')} | {cell('cudnn')} | "
            f"{ratio('flash')} | {ratio('cudnn')} |")
    modes = sorted({f"{name}: {m[f'{name}_gqa']}" for m in merged for name, _ in PEERS if m[f"{name}_gqa"]})
    table = "\n".join(lines)
    table += ("\n\nSOL: decode = bf16 KV bytes / 4.8 TB/s / time (target ≥ 0.7), prefill = causal FLOPs / "
              f"989 TFLOP/s / time (target ≥ 0.35). epinfer reads a {kv} KV cache; its SOL "
              "on the bytes it reads is `sol_actual` in the JSON. Peers: PyTorch "
              f"{torch.__version__}, contiguous bf16 K/V of Nkv heads ({', '.join(modes) or 'none ran'}).\n")
    if notes:
        table += "\nn/a:\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    print(table)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(table)
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "epinfer": doc,
                       "rows": merged}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
