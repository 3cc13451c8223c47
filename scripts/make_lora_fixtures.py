#!/usr/bin/env python3
"""Builds the PEFT LoRA parity fixtures in tests/fixtures/models/<family>/lora/ (run by hand, not by CI).

For each tiny model of scripts/make_model_fixtures.py, Hugging Face PEFT's own LoRA (r 4, alpha 8, no dropout,
every linear projection of attention and MLP targeted) over the frozen base:
  adapter_config.json, adapter_model.safetensors   the initial adapter, as PeftModel.save_pretrained writes it:
                                                   A as PEFT initialises it (Kaiming-uniform), B perturbed from
                                                   zero so that every gradient is non-zero
  reference.safetensors
    input_ids/labels [4, 16]                         a batch with loss-masked positions (the base fixture's)
    fp32.logits, fp32.loss, fp32.grad.<name>         the adapter's gradients, PEFT's saved names
    bf16.logits, bf16.loss, bf16.grad.<name>         the same model cast to bfloat16
    train.ids/train.labels [5, 4, 16], train.loss/grad_norm/lr [5], final.<name>
                                                     5 steps of torch AdamW over the adapter only (decay on every
                                                     adapter matrix), 2 micro-batches of 2, global-norm clipping
    merged.<base name>                               each targeted base weight after merge_and_unload of the trained
                                                     adapter
  training.json                                      the settings and versions
Needs: pip install torch==2.11.0 transformers==4.57.3 peft==0.17.1 safetensors
"""
import copy
import json
import os
import sys

import peft
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_model_fixtures import logits_loss_grads, train_steps  # noqa: E402

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "models")
FAMILIES = ["llama3", "llama32", "qwen2", "qwen3", "mistral"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0)
TRAIN = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=0.5, steps=5,
             micro_batch=2, grad_accum=2, seq_len=16, schedule="cosine", warmup_steps=1)


def saved_name(name):
    """PEFT's in-memory name (with the adapter's name) as save_pretrained writes it."""
    return name.replace(".default", "")


def lora_params(model):
    return [(saved_name(n), p) for n, p in model.named_parameters() if p.requires_grad]


def adapter_trajectory(model):
    """TRAIN's steps of torch AdamW over `model`'s adapters (train.* and each adapter's final.<name>)."""
    params = [p for _, p in lora_params(model)]
    assert all(p.dim() == 2 for p in params)
    opt = torch.optim.AdamW(params, lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]), eps=TRAIN["eps"],
                            weight_decay=TRAIN["weight_decay"], foreach=False)
    sched = transformers.get_scheduler(TRAIN["schedule"], opt, num_warmup_steps=TRAIN["warmup_steps"],
                                       num_training_steps=TRAIN["steps"])
    gen = torch.Generator().manual_seed(7)
    ref = train_steps(model, params, opt, sched, gen, model.config.vocab_size, TRAIN)
    for name, p in lora_params(model):
        ref[f"final.{name}"] = p.detach().clone()
    return ref


def build(family):
    src = os.path.join(MODELS, family)
    out = os.path.join(src, "lora")
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    base = transformers.AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32,
                                                             attn_implementation="eager")
    torch.manual_seed(2024)
    config = peft.LoraConfig(task_type="CAUSAL_LM", target_modules=TARGETS, bias="none", **LORA)
    model = peft.get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    cfg_path = os.path.join(out, "adapter_config.json")
    with open(cfg_path) as f:
        adapter_config = json.load(f)
    adapter_config["base_model_name_or_path"] = family  # the machine's path would leak into the fixture
    adapter_config["target_modules"] = sorted(adapter_config["target_modules"])  # a set in PEFT: any order
    os.remove(os.path.join(out, "README.md"))  # PEFT's model card template
    with open(cfg_path, "w") as f:
        json.dump(adapter_config, f, indent=2, sort_keys=True)

    base_ref = load_file(os.path.join(src, "reference.safetensors"))
    ids, labels = base_ref["input_ids"], base_ref["labels"]
    ref = {"input_ids": ids, "labels": labels}
    ref.update(logits_loss_grads(model, ids, labels, lora_params))

    m = copy.deepcopy(model)
    ref.update(adapter_trajectory(m))
    n_adapter = sum(p.numel() for _, p in lora_params(m))
    merged = m.merge_and_unload()
    for name, p in merged.named_parameters():
        if any(f".{t}.weight" in name for t in TARGETS):
            ref[f"merged.{name}"] = p.detach().clone()
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "reference.safetensors"))
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(dict(TRAIN, lora=LORA, target_modules=TARGETS, transformers=transformers.__version__,
                       peft=peft.__version__, torch=torch.__version__), f, indent=2)
    for f in os.listdir(out):
        os.chmod(os.path.join(out, f), 0o644)
    print(f"{family}: {n_adapter} adapter params, losses "
          f"{[round(x, 4) for x in ref['train.loss'].tolist()]}")


if __name__ == "__main__":
    for family in sys.argv[1:] or FAMILIES:
        build(family)
