#!/usr/bin/env python3
"""Builds the Hugging Face parity fixtures in tests/fixtures/models/ (run by hand, not by CI).

For each architecture: a small random-init model saved with save_pretrained (real HF safetensors files,
one of them sharded), and reference.safetensors holding what Hugging Face + torch compute for it:
  input_ids/labels             [4, 16]  a batch with loss-masked (-100) positions
  fp32.logits, fp32.loss, fp32.grad.<param>     eager attention, float32
  bf16.logits, bf16.loss, bf16.grad.<param>     the same model cast to bfloat16
  train.ids/train.labels       [5, 4, 16]  5 optimizer steps of 2 micro-batches of 2 rows
  train.loss, train.grad_norm, train.lr [5]; final.<param>: weights after the 5 steps
Training: fp32, torch.optim.AdamW (decay on >=2-D params only), global-norm clipping, loss summed over
micro-batches and divided by the step's valid-target count, HF schedules (transformers.get_scheduler).
Needs: pip install torch==2.11.0 transformers==4.57.1 safetensors
"""
import copy
import json
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "models")

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)

ARCHS = {
    # name: (config class, extra config, schedule, warmup, shard size)
    "llama3": (transformers.LlamaConfig, dict(rope_theta=500000.0, tie_word_embeddings=False), "cosine", 2, "40KB"),
    "llama32": (transformers.LlamaConfig,
                dict(rope_theta=500000.0, tie_word_embeddings=True,
                     rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=64)),
                "linear", 1, None),
    "qwen2": (transformers.Qwen2Config, dict(rope_theta=1000000.0, tie_word_embeddings=True), "constant_with_warmup", 1, None),
    "qwen3": (transformers.Qwen3Config, dict(rope_theta=1000000.0, head_dim=24, tie_word_embeddings=False), "cosine", 1, None),
    "mistral": (transformers.MistralConfig, dict(rope_theta=10000.0, sliding_window=8, tie_word_embeddings=False), "linear", 0, None),
}

TRAIN = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=0.5, steps=5,
             micro_batch=2, grad_accum=2, seq_len=16)


def make_batch(gen, rows, seq, vocab):
    ids = torch.randint(0, vocab, (rows, seq), generator=gen)
    labels = ids.clone()
    labels[:, :3] = -100                      # a "prompt" that carries no loss
    labels[0, 8:11] = -100                    # and a masked span in the middle of one row
    return ids, labels


def token_loss_sum(logits, labels):
    # HF's causal shift: position t predicts token t+1.
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100,
                           reduction="sum")


def logits_loss_grads(model, ids, labels, named_trainable):
    """fp32 and bf16 copies of `model` on one batch: logits, loss and the gradient of each (name, parameter) that
    named_trainable(copy) yields, as reference tensors (<dtype>.logits, <dtype>.loss, <dtype>.grad.<name>)."""
    ref = {}
    n_valid = int((labels[:, 1:] != -100).sum())
    for tag, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        m = copy.deepcopy(model).to(dtype)
        m.zero_grad()
        logits = m(input_ids=ids).logits
        loss = token_loss_sum(logits, labels) / n_valid
        loss.backward()
        ref[f"{tag}.logits"] = logits.detach().float()
        ref[f"{tag}.loss"] = loss.detach().float().reshape(1)
        for name, p in named_trainable(m):
            ref[f"{tag}.grad.{name}"] = p.grad.detach().clone()
    return ref


def train_steps(model, params, opt, sched, gen, vocab, train):
    """train["steps"] optimizer steps of train["grad_accum"] micro-batches, clipping `params` by global norm: the
    batches and what the run recorded, as reference tensors (train.*)."""
    rows = train["micro_batch"] * train["grad_accum"]
    t_ids, t_labels, losses, norms, lrs = [], [], [], [], []
    for step in range(train["steps"]):
        ids, labels = make_batch(gen, rows, train["seq_len"], vocab)
        t_ids.append(ids)
        t_labels.append(labels)
        n_valid = int((labels[:, 1:] != -100).sum())
        opt.zero_grad()
        total = 0.0
        for mb in range(train["grad_accum"]):
            sl = slice(mb * train["micro_batch"], (mb + 1) * train["micro_batch"])
            loss = token_loss_sum(model(input_ids=ids[sl]).logits, labels[sl]) / n_valid
            loss.backward()
            total += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, train["max_grad_norm"])))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        losses.append(total)
    return {"train.ids": torch.stack(t_ids), "train.labels": torch.stack(t_labels),
            "train.loss": torch.tensor(losses, dtype=torch.float64),
            "train.grad_norm": torch.tensor(norms, dtype=torch.float64),
            "train.lr": torch.tensor(lrs, dtype=torch.float64)}


def build(name, cls, extra, schedule, warmup, shard):
    torch.manual_seed(1234)
    config = cls(**COMMON, **extra)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():  # HF inits norms to 1 and biases to 0; perturb so their gradients matter
        for pname, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):  # the model's files; lora/ (scripts/make_lora_fixtures.py) stays
        if os.path.isfile(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)

    gen = torch.Generator().manual_seed(42)
    ref = {}
    ids, labels = make_batch(gen, 4, TRAIN["seq_len"], config.vocab_size)
    ref["input_ids"], ref["labels"] = ids, labels
    n_valid = int((labels[:, 1:] != -100).sum())

    ref.update(logits_loss_grads(model, ids, labels, lambda m: m.named_parameters()))

    # 5 optimizer steps: accumulation, clipping, weight decay on matrices only, an HF schedule.
    m = copy.deepcopy(model)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    no_decay = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]), eps=TRAIN["eps"], foreach=False)
    sched = transformers.get_scheduler(schedule, opt, num_warmup_steps=warmup, num_training_steps=TRAIN["steps"])
    ref.update(train_steps(m, list(m.parameters()), opt, sched, gen, config.vocab_size, TRAIN))
    for pname, p in m.named_parameters():
        ref[f"final.{pname}"] = p.detach().clone()
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "reference.safetensors"))
    meta = dict(TRAIN, schedule=schedule, warmup_steps=warmup, transformers=transformers.__version__,
                torch=torch.__version__)
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(f"{name}: {sum(p.numel() for p in model.parameters())} params, losses "
          f"{[round(x, 4) for x in ref['train.loss'].tolist()]}, "
          f"grad norms {[round(x, 3) for x in ref['train.grad_norm'].tolist()]}")


if __name__ == "__main__":
    names = sys.argv[1:] or list(ARCHS)
    for n in names:
        build(n, *ARCHS[n])
