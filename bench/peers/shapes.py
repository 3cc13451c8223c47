"""The Llama shapes of bench/llama_shapes.h for the Python side (no torch import: the summary uses it too), and
shapes given as a directory with a Hugging Face config.json (bench/shapes/)."""

import json
import os

VOCAB = 128256
SHAPES = {  # hidden, intermediate, layers, heads, kv heads, tied embeddings
    "llama-1b": (2048, 8192, 16, 32, 8, True),
    "llama-3b": (3072, 8192, 28, 24, 8, True),
    "llama-8b": (4096, 14336, 32, 32, 8, False),
    "llama-70b": (8192, 28672, 80, 64, 8, False),
}


def shape_config(shape):
    """The Hugging Face config.json of a shape given as a directory (bench/shapes/qwen2.5-32b), else None."""
    path = os.path.join(shape, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def dims(shape):
    """SHAPES[name], or for "name@LAYERS" that shape at another depth (bench/llama_shapes.h does the same), or a
    directory's config.json."""
    cfg = shape_config(shape)
    if cfg is not None:
        return (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                cfg.get("num_key_value_heads", cfg["num_attention_heads"]), bool(cfg.get("tie_word_embeddings", False)))
    base, _, depth = shape.partition("@")
    if base not in SHAPES or (depth and not (depth.isdigit() and 1 <= int(depth) <= 1024)):
        raise ValueError(f"unknown shape '{shape}' (llama-1b, llama-3b, llama-8b or llama-70b, optionally @LAYERS, "
                         "or a directory with a config.json)")
    h, ff, layers, heads, kv, tied = SHAPES[base]
    return h, ff, int(depth) if depth else layers, heads, kv, tied


def vocab(shape):
    cfg = shape_config(shape)
    return cfg["vocab_size"] if cfg is not None else VOCAB


def params(shape):
    """Parameter count of the shape: embedding, layers (attention with Qwen2's q/k/v biases, SwiGLU MLP, two norms),
    final norm, LM head."""
    h, ff, layers, heads, kv, tied = dims(shape)
    head_dim = h // heads
    cfg = shape_config(shape)
    biases = heads * head_dim + 2 * kv * head_dim if cfg is not None and cfg.get("model_type") == "qwen2" else 0
    layer = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h + 3 * h * ff + 2 * h + biases
    v = vocab(shape)
    return v * h + layers * layer + h + (0 if tied else v * h)
