#!/usr/bin/env python3
"""Plain PyTorch + Hugging Face reference for one decoder layer on the GPU: the forward (no autograd) and the
forward + backward under autograd (what the sliding engine's recompute backward does), bf16, SDPA, causal.
Usage: hf_layer_reference.py HIDDEN INTERMEDIATE HEADS KV_HEADS BATCH SEQ  -> one JSON line.
Compare with bench/trace_summary.py's layer_forward_ms_median / layer_backward_ms_median."""
import json
import sys

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding


def timed(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main():
    h, ff, heads, kv, batch, seq = map(int, sys.argv[1:7])
    cfg = LlamaConfig(hidden_size=h, intermediate_size=ff, num_attention_heads=heads, num_key_value_heads=kv,
                      rope_theta=500000.0, max_position_embeddings=max(seq, 8192), attn_implementation="sdpa")
    layer = LlamaDecoderLayer(cfg, layer_idx=0).cuda().to(torch.bfloat16)
    rope = LlamaRotaryEmbedding(cfg).cuda()
    x = torch.randn(batch, seq, h, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(seq, device="cuda").unsqueeze(0)
    cos_sin = rope(x, pos)
    dy = torch.randn_like(x)

    def fwd():
        with torch.no_grad():
            layer(x, position_embeddings=cos_sin, position_ids=pos)

    def fwd_bwd():
        xi = x.detach().requires_grad_(True)
        out = layer(xi, position_embeddings=cos_sin, position_ids=pos)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(dy)

    flops_fwd = 2 * batch * seq * (h * (h + 2 * kv * (h // heads)) + h * h + 3 * h * ff) \
        + 2 * 2 * batch * seq * seq * h / 2
    f, fb = timed(fwd), timed(fwd_bwd)
    print(json.dumps({"bench": "hf_layer_reference", "hidden": h, "intermediate": ff, "heads": heads,
                      "kv_heads": kv, "batch": batch, "seq": seq, "torch": torch.__version__,
                      "layer_forward_ms": round(f, 3), "layer_forward_backward_ms": round(fb, 3),
                      "forward_tflops": round(flops_fwd / f / 1e9, 1),
                      "forward_backward_tflops": round(3 * flops_fwd / fb / 1e9, 1)}))


if __name__ == "__main__":
    main()
