#!/usr/bin/env python3
"""Checks tests/fixtures/chat_templates/masks.json against TRL itself.

TRL's SFTTrainer trains a conversational prompt/completion line on the completion only: it tokenizes the prompt with
the generation prompt and the prompt plus completion through the tokenizer's chat template, and masks the prompt's
tokens. This script builds an SFTTrainer (a one-layer random Llama on the CPU, completion_only_loss) over the
masks.json lines that are prompt/completion pairs of a prefix-preserving template, without tools (a datasets table
would rewrite the tools' schemas), with strftime_now pinned to the goldens' instant, and compares TRL's input_ids and
completion_mask with the tokens and the trained ranges recorded there (which chat_template_test checks ours against).

Usage: scripts/check_masks_with_trl.py   (pip: trl==0.25.1 transformers==4.57.3 datasets==4.4.1 accelerate torch)
"""
import datetime
import json
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
import transformers.utils.chat_template_utils as chat_template_utils  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


class PinnedClock(datetime.datetime):
    """strftime_now's clock in transformers' template environment, as make_chat_goldens.py pinned it."""

    @classmethod
    def now(cls, tz=None):
        return datetime.datetime(2026, 7, 26, 12, 0, 0)


def main():
    chat_template_utils.datetime = PinnedClock
    masks = json.load(open(os.path.join(FIXTURES, "chat_templates", "masks.json"), encoding="utf-8"))
    groups = {}
    for c in masks["cases"]:
        if "prompt" in c["line"] and c.get("trl") and "tools" not in c["line"]:
            groups.setdefault((c["template"], c["tokenizer"]), []).append(c)
    checked, differ = 0, []
    for (template, tokenizer), cases in groups.items():
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(FIXTURES, "tokenizers", tokenizer, "tokenizer.json"))
        for key, value in cases[0]["special_tokens"].items():
            if key != "unk_token":  # no template renders it; one absent from the vocabulary recurses in transformers
                setattr(tok, key, value)
        if tok.pad_token is None or tok.pad_token not in tok.get_vocab():
            tok.pad_token = list(tok.get_added_vocab())[0]  # SFTTrainer wants one in the vocabulary; none is rendered
        tok.chat_template = open(os.path.join(FIXTURES, "chat_templates", template), encoding="utf-8").read()
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
        rows = [{"prompt": c["line"]["prompt"], "completion": c["line"]["completion"]} for c in cases]
        args = SFTConfig(output_dir="/tmp/check-masks-with-trl", max_length=None, report_to=[], use_cpu=True,
                         completion_only_loss=True)
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
        for c, row in zip(cases, trainer.train_dataset):
            checked += 1
            want = [-100] * len(c["ids"])
            for first, end in c["trained"]:
                for t in range(first, end):
                    want[t] = c["ids"][t]
            got = [i if m else -100 for i, m in zip(row["input_ids"], row["completion_mask"])]
            if row["input_ids"] != c["ids"] or got != want:
                differ.append(f"{template} {c['case']}")
    import trl
    print(f"TRL {trl.__version__} SFTTrainer: {checked - len(differ)} of {checked} prompt/completion lines equal")
    for d in differ:
        print("differs:", d)
    return 1 if differ or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
