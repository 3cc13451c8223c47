"""The Llama shapes of bench/llama_shapes.h for the Python side (no torch import: the summary uses it too)."""

VOCAB = 128256
SHAPES = {  # hidden, intermediate, layers, heads, kv heads, tied embeddings
    "llama-1b": (2048, 8192, 16, 32, 8, True),
    "llama-3b": (3072, 8192, 28, 24, 8, True),
    "llama-8b": (4096, 14336, 32, 32, 8, False),
    "llama-70b": (8192, 28672, 80, 64, 8, False),
}


def dims(shape):
    """SHAPES[name], or for "name@LAYERS" that shape at another depth (bench/llama_shapes.h does the same)."""
    base, _, depth = shape.partition("@")
    if base not in SHAPES or (depth and not (depth.isdigit() and 1 <= int(depth) <= 1024)):
        raise ValueError(f"unknown shape '{shape}' (llama-1b, llama-3b, llama-8b or llama-70b, optionally @LAYERS)")
    h, ff, layers, heads, kv, tied = SHAPES[base]
    return h, ff, int(depth) if depth else layers, heads, kv, tied


def params(shape):
    """Parameter count of the shape: embedding, layers (attention, SwiGLU MLP, two norms), final norm, LM head."""
    h, ff, layers, heads, kv, tied = dims(shape)
    head_dim = h // heads
    layer = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h + 3 * h * ff + 2 * h
    return VOCAB * h + layers * layer + h + (0 if tied else VOCAB * h)
