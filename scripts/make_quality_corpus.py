#!/usr/bin/env python3
"""Builds the real-text corpus and tokenizer of the 8-bit AdamW quality run (bench/quality_8bit.sh with
QUALITY=corpus): run by hand; the outputs are not checked in (OUT, default .quality/, is git-ignored and carried to
the GPU box; xz -9e train.jsonl there keeps the carry small: bench/quality_8bit.sh unpacks it).
  OUT/train.jsonl          {"text": ...} samples of ~2,000 characters: the reStructuredText sources of the Python 3.11
                           documentation as Debian's python3.11-doc package ships them (_sources/**/*.rst.txt),
                           every ninth sample (in file order) of them
  OUT/tokenizer/           tokenizer.json (byte-level BPE, the Llama 3 pre-tokenizer, 8,192 tokens, trained here on
                           the corpus) and tokenizer_config.json; <|begin_of_text|> and <|end_of_text|> are ids 0 and 1
                           (make_random_model's config names them so)
The model is drawn on the GPU box: make_random_model llama-100m OUT/model OUT/tokenizer.
Needs: apt-get download python3.11-doc (or DEB=path), pip install tokenizers==0.22.2
Usage: scripts/make_quality_corpus.py [OUT]
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
VOCAB = 8192
SAMPLE_CHARS = 2000
KEEP_EVERY = 9


def samples(paths):
    """Each file's paragraphs, grouped in order into samples of about SAMPLE_CHARS characters."""
    for path in paths:
        text = open(path, encoding="utf-8", errors="replace").read()
        piece = ""
        for para in text.split("\n\n"):
            if piece and len(piece) + len(para) > SAMPLE_CHARS:
                yield piece
                piece = ""
            piece = piece + "\n\n" + para if piece else para
        if piece.strip():
            yield piece


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else ".quality"
    with tempfile.TemporaryDirectory() as tmp:
        deb = os.environ.get("DEB")
        if not deb:
            subprocess.run(["apt-get", "download", "python3.11-doc"], cwd=tmp, check=True, capture_output=True)
            deb = glob.glob(os.path.join(tmp, "python3.11-doc_*.deb"))[0]
        subprocess.run(["dpkg-deb", "-x", deb, os.path.join(tmp, "x")], check=True)
        paths = sorted(glob.glob(os.path.join(tmp, "x", "**", "_sources", "**", "*.rst.txt"), recursive=True))
        data = [s for s in samples(paths) if len(s) > 200]
    data = data[::KEEP_EVERY]  # a ninth, spread over the whole documentation: ~0.9M tokens, 0.8 MB as xz
    os.makedirs(os.path.join(out, "tokenizer"), exist_ok=True)
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        for s in data:
            f.write(json.dumps({"text": s}) + "\n")

    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(data, trainer=trainers.BpeTrainer(
        vocab_size=VOCAB, min_frequency=2, show_progress=False, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = specials[0]
    assert tok.token_to_id(bos) == 0 and tok.token_to_id(specials[1]) == 1
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, 0)])
    tok.save(os.path.join(out, "tokenizer", "tokenizer.json"), pretty=False)
    with open(os.path.join(out, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": bos, "eos_token": specials[1], "model_max_length": 2048,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
    chars = sum(len(s) for s in data)
    tokens = sum(len(e.ids) for e in tok.encode_batch(data))
    print(json.dumps({"files": len(paths), "samples": len(data), "chars": chars, "tokens": tokens,
                      "vocab": tok.get_vocab_size()}))


if __name__ == "__main__":
    main()
