#!/usr/bin/env python3
"""One peer's training throughput on a Llama-shaped random-init model, as one JSON line.

  peer_train.py MODE SHAPE BATCH [SEQ=1024] [STEPS=3]
    MODE  plain       PyTorch + HF Transformers on the GPU: fp32 master weights, bf16 autocast, fused AdamW,
                      activation checkpointing (where it fits)
          fsdp2       PyTorch FSDP2 (fully_shard) on one GPU with CPUOffloadPolicy: parameters, gradients and the
                      AdamW step on the host, bf16 compute (MixedPrecisionPolicy), checkpointing
          fwdbwd      PyTorch + HF Transformers on the GPU, bf16 weights, forward + backward with activation
                      checkpointing and no optimizer: the throughput ceiling of the GPU work alone, which an
                      offloading trainer matches when its transfers and updates are fully hidden
          deepspeed   DeepSpeed ZeRO-3 with parameters and optimizer offloaded to the CPU (ZeRO-Offload, DeepSpeed's
                      CPU Adam), bf16, checkpointing
          peft        Hugging Face PEFT LoRA (r 16, alpha 32, no dropout, every attention and MLP projection) over a
                      bf16 base on the GPU, adapters in fp32 (PEFT's default), bf16 autocast, activation
                      checkpointing, fused AdamW over the adapters; model FLOPs 4 per frozen and 6 per trainable
                      parameter (no weight gradient for the base), as sliding_bench --lora-r counts them
          qlora       the same over an NF4 base (bitsandbytes Linear4bit, double quantisation, bf16 compute, each
                      projection drawn on the GPU and quantised there layer by layer), prepared as QLoRA recipes do
                      (prepare_model_for_kbit_training: norms and embeddings in fp32, checkpointing)
    SHAPE llama-1b | llama-3b | llama-8b | llama-70b (the shapes of bench/llama_shapes.h: vocab 128256), optionally @LAYERS
          for that shape at another depth (llama-8b@48: 11.5B parameters), as the largest-model ladder uses; or a
          directory with a Hugging Face config.json (bench/shapes/qwen2.5-32b), built in the mode's dtype (plain,
          fwdbwd, fsdp2, deepspeed, peft; qlora takes Llama shapes)

Same work as slideformer's sliding_bench: BATCH sequences of SEQ random tokens per optimizer step, one micro-batch,
AdamW (lr 1e-5, betas 0.9/0.95, weight decay 0.1), global-norm clipping at 1.0. One warm-up step, then STEPS timed
steps (CUDA synchronised). Prints tokens/s, the model TFLOPS the same way (6*N*tokens + attention), peak GPU memory
(allocator) and peak host RSS; on failure (e.g. out of memory) a line with "error". Lines {"phase": ...} say
where it is, for bench/peers/supervise.py, which reports a run killed before it could print (the OOM killer).
"""
import json
import os
import resource
import sys
import time

import torch

from shapes import VOCAB, dims, shape_config


def llama_config(shape):
    from transformers import LlamaConfig

    h, ff, layers, heads, kv, tied = dims(shape)
    return LlamaConfig(vocab_size=VOCAB, hidden_size=h, intermediate_size=ff, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, rope_theta=500000.0,
                       max_position_embeddings=8192, tie_word_embeddings=tied, rms_norm_eps=1e-5,
                       attn_implementation="sdpa")


def model_config(shape):
    """The shape's transformers config: a Llama of shapes.py, or a directory's config.json (any architecture)."""
    if shape_config(shape) is None:
        return llama_config(shape)
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(shape)
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(shape, dtype, device):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):  # built in its dtype: a 32B bf16 model never exists in fp32 on the card
        model = AutoModelForCausalLM.from_config(model_config(shape), dtype=dtype)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model


def batches(batch, seq, n):
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
        yield ids.cuda(non_blocking=True)


def clipped_step(model, opt, autocast):
    """One optimizer step: forward + loss (bf16 autocast when asked), backward, clipping at 1.0, AdamW."""

    def step(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def run_plain(shape, batch, seq, steps):
    model = build_model(shape, torch.float32, "cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    return model, clipped_step(model, opt, autocast=True)


def run_fwdbwd(shape, batch, seq, steps):
    model = build_model(shape, torch.bfloat16, "cuda")

    def step(ids):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss

    return model, step


def run_fsdp2(shape, batch, seq, steps):
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("cuda:nccl,cpu:gloo", rank=0, world_size=1)
    model = build_model(shape, torch.float32, "cpu")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=True)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mp_policy=mp, offload_policy=offload)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)
    return model, clipped_step(model, opt, autocast=False)  # the mixed-precision policy casts to bf16


def run_deepspeed(shape, batch, seq, steps):
    import deepspeed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    deepspeed.init_distributed()
    config = {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu", "pin_memory": True},
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True,
            "contiguous_gradients": True,
        },
        "steps_per_print": 10**9,
    }
    model = build_model(shape, torch.float32, "cpu")  # ZeRO-3 partitions and offloads it in initialize
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    def step(ids):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        return loss

    return engine, step


def lora_training(model):
    """PEFT LoRA (r 16, alpha 32, every projection) over `model` and its training step: bf16 autocast, fused AdamW over
    the adapters, clipping."""
    import peft

    config = peft.LoraConfig(task_type="CAUSAL_LM", r=16, lora_alpha=32, lora_dropout=0.0, bias="none",
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"])
    model = peft.get_peft_model(model, config)
    # Training mode: gradient checkpointing (QLoRA's recipe) applies only there, and a model built under
    # transformers 5 from a config starts in eval mode.
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

    def step(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return model, step


def run_peft(shape, batch, seq, steps):
    return lora_training(build_model(shape, torch.bfloat16, "cuda"))


def build_qlora_model(shape):
    """A random-init Llama with every layer projection a bitsandbytes NF4 Linear4bit, never whole in bf16."""
    import bitsandbytes as bnb
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = llama_config(shape)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in targets:
                if not hasattr(parent, name):
                    continue
                lin = getattr(parent, name)
                q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False, compute_dtype=torch.bfloat16,
                                      compress_statistics=True, quant_type="nf4", device="meta")
                w = torch.randn(lin.out_features, lin.in_features, device="cuda", dtype=torch.bfloat16) * 0.02
                q.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4", compress_statistics=True)
                q.weight = q.weight.to("cuda")  # quantised here
                setattr(parent, name, q)
                del w
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.to_empty(device="cuda")
            norm.weight.data.fill_(1.0)
    model.model.norm.to_empty(device="cuda")
    model.model.norm.weight.data.fill_(1.0)
    for m in (model.model.embed_tokens, model.lm_head):
        m.to_empty(device="cuda")
        m.weight.data = (torch.randn_like(m.weight, dtype=torch.float32) * 0.02).to(torch.bfloat16)
    model.model.rotary_emb = LlamaRotaryEmbedding(config=cfg, device="cuda")
    model.config.use_cache = False
    return model


def run_qlora(shape, batch, seq, steps):
    import peft

    model = build_qlora_model(shape)
    if os.environ.get("PEER_QLORA_PREPARE", "1") == "1":
        # PEFT's recipe: also casts the embeddings, norms and head to fp32.
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                                     gradient_checkpointing_kwargs={"use_reentrant": False})
    else:  # gradient checkpointing alone, everything else left in bf16
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return lora_training(model)


def phase(name):
    print(json.dumps({"phase": name}), flush=True)


def main():
    mode, shape, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seq = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    h, ff, layers, heads, kv, tied = dims(shape)
    out = {"bench": "peer", "peer": mode, "shape": shape, "batch": batch, "seq": seq, "steps": steps,
           "torch": torch.__version__}
    try:
        import transformers

        out["transformers"] = transformers.__version__
        if mode == "deepspeed":
            import deepspeed

            out["deepspeed"] = deepspeed.__version__
        if mode in ("peft", "qlora"):
            import peft

            out["peft"] = peft.__version__
        if mode == "qlora":
            import bitsandbytes

            out["bitsandbytes"] = bitsandbytes.__version__
        setup = {"plain": run_plain, "fwdbwd": run_fwdbwd, "fsdp2": run_fsdp2, "deepspeed": run_deepspeed,
                 "peft": run_peft, "qlora": run_qlora}[mode]
        t_setup = time.time()
        phase("setup")
        model, step = setup(shape, batch, seq, steps)
        out["setup_s"] = round(time.time() - t_setup, 1)
        n = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
        data = batches(batch, seq, steps + 1)
        phase("warm-up")
        step(next(data))
        torch.cuda.synchronize()
        phase("steps")
        t0 = time.time()
        loss = None
        for ids in data:
            loss = step(ids)
        torch.cuda.synchronize()
        secs = (time.time() - t0) / steps
        tokens = batch * seq
        attn = 3.0 * 2.0 * 2.0 * layers * seq * seq * h / 2.0 * batch
        if mode == "qlora":  # a Params4bit holds two weights a byte: count the weights it stands for
            n = sum(p.numel() * (2 if p.dtype == torch.uint8 else 1) for p in model.parameters())
        adapters = mode in ("peft", "qlora")
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) if adapters else n
        flops_per_token = 4.0 * (n - trainable) + 6.0 * trainable if adapters else 6.0 * n
        out.update({"params": n, "trainable_params": trainable, "tokens_per_s": round(tokens / secs, 1),
                    "step_s": round(secs, 3),
                    "model_tflops": round((flops_per_token * tokens + attn) / secs / 1e12, 2), "loss": loss.item(),
                    "peak_gpu_bytes": torch.cuda.max_memory_reserved(),
                    "peak_host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    except Exception as e:  # out of memory, a missing package: reported, not hidden
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        out["peak_gpu_bytes"] = torch.cuda.max_memory_reserved() if torch.cuda.is_available() else 0
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
