#!/usr/bin/env python3
"""Builds the bundled demo in deploy/demo/ (run by hand; outputs are checked in):
  train.jsonl   600 prompt/completion pairs of small-number arithmetic and word facts, generated here from
                templates (self-made, public domain)
  model/        a Llama-architecture model in Hugging Face format (config.json, model.safetensors in bf16,
                tokenizer.json, tokenizer_config.json), random init (seed 0), ~1.2M parameters
The tokenizer is a byte-level BPE with the Llama 3 pre-tokenizer, trained here on the generated text.
Needs: pip install torch==2.11.0 transformers==4.57.1 tokenizers==0.22.2
"""
import json
import os
import random

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "deploy", "demo")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
COLORS = {"sky": "blue", "grass": "green", "snow": "white", "coal": "black", "blood": "red", "sun": "yellow"}


def samples(rng):
    out = []
    for _ in range(600):
        kind = rng.randrange(4)
        a, b = rng.randrange(0, 7), rng.randrange(0, 6)
        if kind == 0:
            out.append({"prompt": f"Question: what is {a} plus {b}?\nAnswer:", "completion": f" {a + b}."})
        elif kind == 1:
            out.append({"prompt": f"Question: spell the number {a + b}.\nAnswer:", "completion": f" {WORDS[a + b]}."})
        elif kind == 2:
            big, small = max(a, b), min(a, b)
            out.append({"prompt": f"Question: what is {big} minus {small}?\nAnswer:", "completion": f" {big - small}."})
        else:
            thing = rng.choice(sorted(COLORS))
            out.append({"prompt": f"Question: what color is the {thing}?\nAnswer:", "completion": f" {COLORS[thing]}."})
    return out


def main():
    rng = random.Random(0)
    data = samples(rng)
    os.makedirs(os.path.join(OUT, "model"), exist_ok=True)
    with open(os.path.join(OUT, "train.jsonl"), "w") as f:
        for d in data:
            f.write(json.dumps(d) + "\n")

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    text = [d["prompt"] + d["completion"] for d in data]
    tok.train_from_iterator(text, trainer=trainers.BpeTrainer(
        vocab_size=384, min_frequency=1, show_progress=False, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    tok.save(os.path.join(OUT, "model", "tokenizer.json"))
    with open(os.path.join(OUT, "model", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": bos, "eos_token": "<|end_of_text|>", "model_max_length": 256,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=384,
                                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=True,
                                      bos_token_id=tok.token_to_id(bos), eos_token_id=tok.token_to_id("<|end_of_text|>"))
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(os.path.join(OUT, "model"), safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"demo: {len(data)} samples, vocab {tok.get_vocab_size()}, model {n} params")


if __name__ == "__main__":
    main()
