"""Usage, on the GPU machine (it has torch and transformers):
  FIXTURE_SEED=2027 python3 gen_fixtures.py OUT_DIR
Edit `specs` to add families or shapes; commit what your tests need under the project's tests/data.

Make tiny, architecture-exact MoE checkpoints with Hugging Face transformers
and record golden outputs from transformers' own forward pass.

Each fixture folder holds:
  config.json, model.safetensors   (as save_pretrained writes them; weights in bf16)
  golden.safetensors               (float32 tensors computed by transformers in fp32
                                    from the saved bf16 checkpoint, reloaded as a user would)
    input_ids      [B, T] int64
    logits         [B, T, V] f32
    hidden.{l}     [B, T, H] f32   output of decoder layer l (hidden_states[l+1])
    mlp_in.{l}     [B*T, H] f32    input of layer l's mlp block (after post-attn norm)
    mlp_out.{l}    [B*T, H] f32    output of layer l's mlp block
    greedy         [B, T+N] int64  greedy continuation (N new tokens), no cache tricks
  keys.txt                         tensor names and shapes in model.safetensors
"""
import json, os, sys, traceback, inspect
import torch
import transformers
from safetensors.torch import save_file, load_file

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
SEED = int(os.environ.get("FIXTURE_SEED", "2027"))
torch.manual_seed(SEED)


def reinit(model, std):
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                if "norm" in name or "layernorm" in name:
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(std * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / (fan_in ** 0.5))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.3 * torch.randn(b.shape, generator=g))


def make(name, cls_name, cfg_cls_name, cfg_kwargs, B=2, T=11, N=6, bias_std=0.05):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    cfg_cls = getattr(transformers, cfg_cls_name)
    cls = getattr(transformers, cls_name)
    cfg = cfg_cls(**cfg_kwargs)
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    model = cls(cfg).to(torch.float32).eval()
    reinit(model, bias_std)
    # Round weights to bf16 and save in bf16 (the real checkpoint dtype).
    model = model.to(torch.bfloat16)
    model.save_pretrained(d, safe_serialization=True)
    # Goldens come from the checkpoint as a user loads it: fresh fp32 model from the saved files
    # (casting the live model back would keep bf16-rounded buffers such as RoPE inv_freq).
    del model
    model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    sd = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(d, f)))
    with open(os.path.join(d, "keys.txt"), "w") as fh:
        for k in sorted(sd):
            fh.write(f"{k}\t{list(sd[k].shape)}\t{sd[k].dtype}\n")
    ids = torch.randint(3, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(SEED + 2))
    caps = {}
    hooks = []
    layers = model.model.layers
    for li, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
        def pre(mod, args, kwargs, li=li):
            x = args[0] if args else kwargs.get("hidden_states")
            caps[f"mlp_in.{li}"] = x.detach().reshape(-1, x.shape[-1]).float().clone()
        def post(mod, args, kwargs, out, li=li):
            y = out[0] if isinstance(out, tuple) else out
            caps[f"mlp_out.{li}"] = y.detach().reshape(-1, y.shape[-1]).float().clone()
        hooks.append(mlp.register_forward_pre_hook(pre, with_kwargs=True))
        hooks.append(mlp.register_forward_hook(post, with_kwargs=True))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    for h in hooks:
        h.remove()
    g = {"input_ids": ids.contiguous(), "logits": out.logits.float().contiguous()}
    for li, hs in enumerate(out.hidden_states[1:]):
        g[f"hidden.{li}"] = hs.float().contiguous()
    g.update({k: v.contiguous() for k, v in caps.items()})
    # Greedy decode, recomputing the whole prefix each step (no KV cache in the reference).
    seq = ids.clone()
    with torch.no_grad():
        for _ in range(N):
            lg = model(input_ids=seq, use_cache=False).logits[:, -1, :]
            seq = torch.cat([seq, lg.argmax(-1, keepdim=True)], dim=1)
    g["greedy"] = seq.contiguous()
    save_file(g, os.path.join(d, "golden.safetensors"))
    with open(os.path.join(d, "README.txt"), "w") as fh:
        fh.write(f"architecture {cls_name}; transformers {transformers.__version__}; torch {torch.__version__}\n")
        fh.write(f"input_ids {list(ids.shape)}, greedy new tokens {N}\n")
    print("OK", name, {k: list(v.shape) for k, v in g.items() if not k.startswith(('hidden.', 'mlp_'))})


def router_fixture(name, n_exp, topk, n_group, topk_group, scaling, tokens=257, H=64):
    """Real-sized DeepSeek-V3-style router: scores -> (topk ids, weights) from transformers' own gate."""
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    cfg = transformers.DeepseekV3Config(vocab_size=64, hidden_size=H, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=n_exp, num_experts_per_tok=topk,
        n_shared_experts=1, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scaling,
        norm_topk_prob=True, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, head_dim=8)
    model = transformers.DeepseekV3ForCausalLM(cfg).float().eval()
    reinit(model, 0.05)
    moe = model.model.layers[1].mlp
    x = torch.randn(1, tokens, H, generator=torch.Generator().manual_seed(SEED + 3))
    gate = moe.gate
    with torch.no_grad():
        logits = gate(x.reshape(-1, H))
        res = moe.route_tokens_to_experts(logits) if hasattr(moe, "route_tokens_to_experts") else None
    t = {"x": x.reshape(-1, H).contiguous(), "gate_weight": gate.weight.detach().float().contiguous(),
         "e_score_correction_bias": gate.e_score_correction_bias.detach().float().contiguous()}
    if isinstance(logits, tuple):
        for i, v in enumerate(logits):
            t[f"gate_out{i}"] = v.detach().contiguous()
    else:
        t["router_logits"] = logits.detach().float().contiguous()
    if res is not None:
        t["topk_idx"] = res[0].detach().to(torch.int64).contiguous()
        t["topk_weight"] = res[1].detach().float().contiguous()
    save_file(t, os.path.join(d, "router.safetensors"))
    with open(os.path.join(d, "README.txt"), "w") as fh:
        fh.write(json.dumps(dict(n_routed_experts=n_exp, num_experts_per_tok=topk, n_group=n_group,
                                 topk_group=topk_group, routed_scaling_factor=scaling, norm_topk_prob=True,
                                 scoring_func="sigmoid", tokens=tokens, hidden=H)) + "\n")
    print("OK", name, {k: list(v.shape) for k, v in t.items()})


specs = [
    ("deepseek_v3_tiny", "DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        first_k_dense_replace=1, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, n_group=4,
        topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=8,
        max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False)),
    ("kimi_k2_tiny_yarn", "DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        first_k_dense_replace=1, n_routed_experts=24, num_experts_per_tok=6, n_shared_experts=1, n_group=1,
        topk_group=1, routed_scaling_factor=2.827, norm_topk_prob=True, num_attention_heads=2, num_key_value_heads=2,
        q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=8,
        max_position_embeddings=2048, rope_theta=50000.0, tie_word_embeddings=False,
        rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 64,
                      "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
    ("deepseek_v2_lite_tiny", "DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2, n_group=1,
        topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=8,
        max_position_embeddings=512, tie_word_embeddings=False)),
    ("qwen3_moe_tiny", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_experts=16, num_experts_per_tok=4, norm_topk_prob=True, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=512, rope_theta=1000000.0,
        tie_word_embeddings=False)),
    ("mixtral_tiny", "MixtralForCausalLM", "MixtralConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_local_experts=8,
        num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, sliding_window=None, tie_word_embeddings=False)),
    ("glm4_moe_tiny", "Glm4MoeForCausalLM", "Glm4MoeConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        first_k_dense_replace=1, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, n_group=1,
        topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=False,
        max_position_embeddings=512, tie_word_embeddings=False)),
    ("olmoe_tiny", "OlmoeForCausalLM", "OlmoeConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_experts=16,
        num_experts_per_tok=4, norm_topk_prob=False, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=512, tie_word_embeddings=False)),
    ("qwen2_moe_tiny", "Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_hidden_layers=2, num_experts=12, num_experts_per_tok=4,
        norm_topk_prob=False, num_attention_heads=4, num_key_value_heads=2, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=512, tie_word_embeddings=False)),
    ("gpt_oss_tiny", "GptOssForCausalLM", "GptOssConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_local_experts=8,
        num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512,
        tie_word_embeddings=False)),
    ("deepseek_v2_tiny", "DeepseekV2ForCausalLM", "DeepseekV2Config", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        first_k_dense_replace=1, n_routed_experts=12, num_experts_per_tok=3, n_shared_experts=2, n_group=1,
        topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=False, topk_method="greedy",
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, head_dim=8, max_position_embeddings=512, tie_word_embeddings=False)),
    ("glm4_moe_qknorm_tiny", "Glm4MoeForCausalLM", "Glm4MoeConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        first_k_dense_replace=1, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, n_group=4,
        topk_group=2, routed_scaling_factor=1.8, norm_topk_prob=True, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True,
        max_position_embeddings=512, tie_word_embeddings=False)),
    ("qwen3_moe_sparse_step_tiny", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_experts=12, num_experts_per_tok=3, norm_topk_prob=False, num_attention_heads=4, num_key_value_heads=1,
        head_dim=16, decoder_sparse_step=1, mlp_only_layers=[0], max_position_embeddings=512, rope_theta=10000.0,
        tie_word_embeddings=True)),
    # Three-layer variants, so that every family runs under pp3 (tests/mpi), with other options on.
    ("mixtral_3l_tiny", "MixtralForCausalLM", "MixtralConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_local_experts=6,
        num_experts_per_tok=3, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=512, sliding_window=None, tie_word_embeddings=False)),
    ("olmoe_3l_tiny", "OlmoeForCausalLM", "OlmoeConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_experts=12,
        num_experts_per_tok=3, norm_topk_prob=True, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=1, pad_token_id=0)),
    ("qwen2_moe_3l_tiny", "Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=40, num_hidden_layers=3, num_experts=10, num_experts_per_tok=2,
        norm_topk_prob=True, num_attention_heads=4, num_key_value_heads=4, decoder_sparse_step=2,
        mlp_only_layers=[], max_position_embeddings=512, tie_word_embeddings=False)),
]

ONLY = set(filter(None, os.environ.get("FIXTURE_ONLY", "").split(",")))  # e.g. FIXTURE_ONLY=olmoe_3l_tiny
for s in specs:
    if ONLY and s[0] not in ONLY:
        continue
    try:
        make(*s)
    except Exception:
        print("FAILED", s[0])
        traceback.print_exc()

for args in [("router_v3_256e_top8_g8", 256, 8, 8, 4, 2.5), ("router_k2_384e_top8_g1", 384, 8, 1, 1, 2.827)]:
    if ONLY and args[0] not in ONLY:
        continue
    try:
        router_fixture(*args)
    except Exception:
        print("FAILED", args[0])
        traceback.print_exc()

# Keep the reference routing code of each architecture for reading (not for copying).
srcs = []
for mod in ["deepseek_v2", "deepseek_v3", "qwen3_moe", "mixtral", "glm4_moe", "olmoe", "qwen2_moe", "gpt_oss"]:
    try:
        m = __import__(f"transformers.models.{mod}.modeling_{mod}", fromlist=["x"])
        srcs.append(f"##### {mod}\n" + inspect.getsource(m))
    except Exception as e:
        srcs.append(f"##### {mod}: {e}\n")
with open(os.path.join(OUT, "transformers_moe_sources.txt"), "w") as fh:
    fh.write("\n".join(srcs))
