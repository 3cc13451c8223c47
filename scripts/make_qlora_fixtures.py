#!/usr/bin/env python3
"""Builds the QLoRA parity fixtures in tests/fixtures/models/<family>/qlora/ (run by hand, not by CI).

For each tiny model of scripts/make_model_fixtures.py, transformers + bitsandbytes load the base in 4 bits on the CPU
(BitsAndBytesConfig: nf4, double quantisation, compute in float32) and PEFT trains the LoRA fixture's initial
adapter (../lora/, r 4, alpha 8, every projection) over it:
  base/config.json, base/model.safetensors       the 4-bit base as save_pretrained writes it (quantization_config;
                                                 each projection as packed codes, absmax, nested absmax and maps,
                                                 the quant_state JSON), which the engine reads as it is
  reference.safetensors
    fp32.logits, fp32.loss, fp32.grad.<name>     on the LoRA fixture's batch (input_ids/labels of the base fixture)
    train.ids/train.labels/train.loss/grad_norm/lr, final.<name>
                                                 5 steps of torch AdamW over the adapter, as the LoRA fixture's
  training.json                                  the settings and versions
and tests/fixtures/models/demo-4bit/: the demo model saved in 4 bits the same way, with its tokenizer.
Needs: pip install torch==2.11.0 transformers==4.57.3 peft==0.17.1 bitsandbytes==0.50.2 safetensors
"""
import json
import os
import shutil
import sys

import bitsandbytes
import peft
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_lora_fixtures import TRAIN, adapter_trajectory, lora_params  # noqa: E402
from make_model_fixtures import token_loss_sum  # noqa: E402

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "models")
FAMILIES = ["llama3", "mistral"]  # qwen3's 48-row projections trip bitsandbytes' CPU weight packing (block_n)


def build(family):
    src = os.path.join(MODELS, family)
    out = os.path.join(src, "qlora")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                            bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)
    base = transformers.AutoModelForCausalLM.from_pretrained(src, quantization_config=quant, device_map="cpu",
                                                             dtype=torch.float32, attn_implementation="eager")
    base.save_pretrained(os.path.join(out, "base"))
    model = peft.PeftModel.from_pretrained(base, os.path.join(src, "lora"), is_trainable=True)
    # On a CPU with AVX512-BF16, bitsandbytes repacks a Linear4bit's weight for a bf16 inference kernel when it runs
    # in eval mode without gradients; QLoRA's reference is the dequantise-then-matmul path, in fp32.
    for module in model.modules():
        if isinstance(module, bitsandbytes.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
    model.train()

    base_ref = load_file(os.path.join(src, "reference.safetensors"))
    ids, labels = base_ref["input_ids"], base_ref["labels"]
    # fp32 compute only: a 4-bit model is not cast to bf16 the way the LoRA fixture's copies are.
    model.zero_grad()
    logits = model(input_ids=ids).logits
    loss = token_loss_sum(logits, labels) / int((labels[:, 1:] != -100).sum())
    loss.backward()
    ref = {"fp32.logits": logits.detach().float(), "fp32.loss": loss.detach().float().reshape(1)}
    for name, p in lora_params(model):
        ref[f"fp32.grad.{name}"] = p.grad.detach().clone()
    model.zero_grad()

    ref.update(adapter_trajectory(model))
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "reference.safetensors"))
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(dict(TRAIN, quantization=quant.to_dict(), transformers=transformers.__version__,
                       peft=peft.__version__, bitsandbytes=bitsandbytes.__version__, torch=torch.__version__), f,
                  indent=2, default=str)
    for root, _, files in os.walk(out):
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    print(f"{family}: losses {[round(x, 4) for x in ref['train.loss'].tolist()]}")


def build_demo():
    """The demo model (deploy/demo/model) saved in 4 bits with its tokenizer: tests/fixtures/models/demo-4bit/, the
    model directory of the QLoRA job tests that start from a 4-bit checkpoint."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "demo", "model")
    out = os.path.join(MODELS, "demo-4bit")
    shutil.rmtree(out, ignore_errors=True)
    quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                            bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)
    base = transformers.AutoModelForCausalLM.from_pretrained(src, quantization_config=quant, device_map="cpu",
                                                             dtype=torch.float32)
    base.save_pretrained(out)
    for f in os.listdir(src):
        if f.startswith("tokenizer") or f == "special_tokens_map.json":
            shutil.copy(os.path.join(src, f), out)
    for f in os.listdir(out):
        os.chmod(os.path.join(out, f), 0o644)
    print(f"demo-4bit: {sorted(os.listdir(out))}")


if __name__ == "__main__":
    for family in sys.argv[1:] or FAMILIES:
        build(family)
    if len(sys.argv) == 1:
        build_demo()
