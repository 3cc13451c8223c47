#!/usr/bin/env python3
"""Builds tokenizer parity fixtures in tests/fixtures/tokenizers/ (run by hand, not by CI).

No hub access here, so each family's tokenizer is a small BPE trained by this script on self-written text
(tests/fixtures/tokenizers/corpus.txt, written by this script; public domain), with the same normalizer,
pre-tokenizer, model options, special tokens, post-processor and decoder as the real files:
  llama3   byte-level BPE, Llama 3 split regex, ignore_merges, <|begin_of_text|> prepended
  qwen2    byte-level BPE, Qwen2 split regex, NFC normalizer, ChatML special tokens
  gpt2     byte-level BPE with the GPT-2 regex inside the ByteLevel pre-tokenizer
  llama2   SentencePiece-style BPE: prepend/replace '▁' normalizer, byte_fallback, <s> prepended
  mistral  SentencePiece-style BPE with the Metaspace pre-tokenizer (prepend_scheme first), byte_fallback
For each: tokenizer.json and expected.jsonl with {text, ids (with special tokens), ids_plain, decoded}.
Needs: pip install tokenizers==0.22.2
"""
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizers")

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = """The quick brown fox jumps over the lazy dog. It's 2026; they're training models that don't fit.
Sliding windows move layers between the host and the device while the optimizer runs on the CPU.
Numbers: 0, 7, 42, 1234, 3.14159, 2^20+7, 1e-5, -17, 100000000, 2026-12-02T13:04:48Z.
Code: def step(self, x): return x * 2  # comment
    for (int i = 0; i < n; ++i) { sum += a[i]; }
    if err != nil { return fmt.Errorf("bad: %w", err) }
Whitespace:   three spaces,\ttabs\t\tand
newlines

and trailing spaces   
Deutsch: Grüße aus München, über die Brücke. Français: déjà vu, où est l'hôtel ? Español: ¿Dónde está la niña?
Русский: Быстрая коричневая лиса прыгает через ленивую собаку. Ελληνικά: γρήγορη καφέ αλεπού.
中文：快速的棕色狐狸跳过了懒狗。日本語：素早い茶色の狐が怠惰な犬を飛び越える。한국어: 빠른 갈색 여우.
العربية: الثعلب البني السريع. עברית: השועל החום המהיר. हिन्दी: तेज़ भूरी लोमड़ी।
Emoji: 🦊🐕 👍🏽 👨‍👩‍👧 ✨🚀 — dashes – and “quotes” ‘single’ … ellipsis.
Contractions: I'M HERE, You'RE there, we'll see, she'd know, it's THEIR'S.
"""

SAMPLES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nmultiple",
    "Numbers 1234567 and 3.14159 and 2^20+7",
    "Grüße aus München — déjà vu ¿Dónde está?",
    "Быстрая коричневая лиса, γρήγορη αλεπού",
    "快速的棕色狐狸跳过了懒狗。素早い茶色の狐",
    "빠른 갈색 여우 العربية עברית हिन्दी",
    "Emoji 🦊🐕 👍🏽 👨‍👩‍👧 ✨🚀",
    "def f(x):\n    return x ** 2  # square\n",
    "I'M HERE, You'RE there, we'll see",
    "unseen bytes: \u0001\u007f zebra-xylophone qwzx",
    "e\u0301 (decomposed e-acute) and \u00e9 (composed)",
    "",
    " ",
    "\n",
] + [
    # Long pieces (one word, no spaces): the merge order over thousands of symbols (where a rescan per merge is
    # quadratic): a fixed pseudo-random base64-like blob, a sentence without its spaces, a run of one letter.
    "".join("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[(i * 7919 + i * i * 104729) % 64]
            for i in range(6000)),
    "Slidingwindowsmovelayersbetweenthehostandthedevice" * 100,
    "e" * 5000,
]

SPECIAL_SAMPLES = {
    "llama3": ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
               "text with <|eot_id|> inside and <|reserved_special_token_0|>"],
    "qwen2": ["<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi!<|im_end|>",
              "a<|endoftext|>b"],
    "gpt2": ["one<|endoftext|>two"],
    "llama2": ["[INST] hi [/INST] answer</s>"],
    "mistral": ["[INST] hi [/INST] answer</s>"],
}


def byte_level(name, regex, specials, bos, normalizer=None, ignore_merges=False, gpt2=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    if gpt2:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=specials)
    tok.train_from_iterator([CORPUS] * 3, trainer=trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def sentencepiece_style(name, metaspace):
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"] if metaspace else ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=900, min_frequency=1, show_progress=False,
                                  special_tokens=specials + byte_tokens, limit_alphabet=200)
    tok.train_from_iterator([CORPUS] * 3, trainer=trainer)
    if metaspace:
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False),
                                         decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def build_all():
    llama3_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                       "<|eot_id|>", "<|reserved_special_token_0|>"]
    qwen_specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return {
        "llama3": byte_level("llama3", LLAMA3_RE, llama3_specials, "<|begin_of_text|>", ignore_merges=True),
        "qwen2": byte_level("qwen2", QWEN2_RE, qwen_specials, None, normalizer=normalizers.NFC()),
        "gpt2": byte_level("gpt2", None, ["<|endoftext|>"], None, gpt2=True),
        "llama2": sentencepiece_style("llama2", metaspace=False),
        "mistral": sentencepiece_style("mistral", metaspace=True),
    }


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write(CORPUS)
    for name, tok in build_all().items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "expected.jsonl"), "w", encoding="utf-8") as f:
            for text in SAMPLES + SPECIAL_SAMPLES[name] + CORPUS.split("\n"):
                ids = tok.encode(text, add_special_tokens=True).ids
                plain = tok.encode(text, add_special_tokens=False).ids
                f.write(json.dumps({"text": text, "ids": ids, "ids_plain": plain,
                                    "decoded": tok.decode(plain, skip_special_tokens=False)},
                                   ensure_ascii=False) + "\n")
        print(name, tok.get_vocab_size(), "tokens")
