#!/usr/bin/env python3
"""An exported LoRA adapter as Hugging Face PEFT reads it, against slideformer's own merge of the same training.

  check_lora_export_with_peft.py BASE ADAPTER MERGED
    BASE     the model directory the job trained on (e.g. deploy/demo/model)
    ADAPTER  a job's export with adapter_export: adapter (adapter_config.json + adapter_model.safetensors)
    MERGED   the same job's export with adapter_export: merged, export_dtype: fp32 (a second run of the same spec:
             training is deterministic, so the adapters are the same)
PeftModel.from_pretrained(BASE, ADAPTER) must give the logits of MERGED loaded by transformers (fp32, within float
rounding), and merge_and_unload() the weights of MERGED. Prints one JSON line; exits 1 when either differs.
Needs: pip install torch transformers peft
"""
import json
import sys

import peft
import torch
import transformers


def main():
    base_dir, adapter_dir, merged_dir = sys.argv[1:4]
    load = dict(torch_dtype=torch.float32, attn_implementation="eager")
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, **load)
    model = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
    ours = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, **load).eval()
    ids = torch.randint(0, base.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs_logits = model(input_ids=ids).logits
        ours_logits = ours(input_ids=ids).logits
    logits_rel = float((theirs_logits - ours_logits).abs().max() / theirs_logits.abs().max())
    merged = model.merge_and_unload()
    ours_params = dict(ours.named_parameters())
    weights_rel = 0.0
    with torch.no_grad():
        for name, p in merged.named_parameters():
            q = ours_params[name]
            weights_rel = max(weights_rel, float((p - q).abs().max() / p.abs().max().clamp_min(1e-12)))
    trainable = sum(p.numel() for n, p in peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(base_dir, **load), adapter_dir).named_parameters()
        if "lora_" in n)
    ok = logits_rel < 1e-5 and weights_rel < 1e-5
    print(json.dumps({"check": "lora_export_with_peft", "peft": peft.__version__,
                      "transformers": transformers.__version__, "adapter_params": trainable,
                      "logits_max_rel": logits_rel, "merged_weights_max_rel": weights_rel, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
