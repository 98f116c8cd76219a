"""Synthetic profiles built in code, so tests and benchmarks do not depend on
shipped profile files (and a profile of a given *shape* can be made for any
size, e.g. BERT-large's 24 x 16 tensors)."""
from __future__ import annotations

from pushpull.profiles import LayerProfile, Profile, TensorSpec


def synthetic_profile(layer_numels: list[int] | list[list[int]], fwd_s: float | list[float] = 0.0,
                      bwd_s: float | list[float] | None = None, model: str = "synthetic",
                      batch_size: int = 32, dtype: str = "float32") -> Profile:
    """Layers in forward order; each entry is a numel or a list of tensor numels.

    Scalar ``fwd_s``/``bwd_s`` are per layer; ``bwd_s`` defaults to 2x forward.
    """
    L = len(layer_numels)
    f = [fwd_s] * L if isinstance(fwd_s, (int, float)) else list(fwd_s)
    if bwd_s is None:
        b = [2 * x for x in f]
    else:
        b = [bwd_s] * L if isinstance(bwd_s, (int, float)) else list(bwd_s)
    if len(f) != L or len(b) != L:
        raise ValueError(f"fwd_s/bwd_s: expected {L} per-layer values")
    layers = []
    for i, spec in enumerate(layer_numels):
        numels = spec if isinstance(spec, (list, tuple)) else [spec]
        tensors = [TensorSpec(f"l{i}.t{j}", int(n), dtype) for j, n in enumerate(numels) if n > 0]
        layers.append(LayerProfile(f"l{i}", float(f[i]), float(b[i]), tensors))
    return Profile(model, layers, batch_size=batch_size, device="synthetic", source="shapes")


def transformer_like(n_layers: int = 24, hidden: int = 1024, vocab: int = 30522, seq: int = 512,
                     compute_s: float = 0.3, batch_size: int = 8, model: str = "bert_large_synthetic") -> Profile:
    """A BERT-shaped profile: embeddings, ``n_layers`` encoder blocks of 16
    tensors each, a pooler; compute spread in proportion to parameters
    (embeddings get little compute). Defaults give BERT-large: ~335M
    parameters in ~390 tensors."""
    h, ff = hidden, 4 * hidden
    layers: list[list[int]] = [[vocab * h, seq * h, 2 * h, 2 * h, h, h]]   # embeddings (+ LN)
    weights = [0.02]
    block = [h * h, h, h * h, h, h * h, h, h * h, h, h, h, h * ff, ff, ff * h, h, h, h]
    for _ in range(n_layers):
        layers.append(block)
        weights.append(1.0)
    layers.append([h * h, h, 2 * h])                                            # pooler + head
    weights.append(0.05)
    tot = sum(weights)
    fwd = [compute_s / 3 * w / tot for w in weights]
    prof = synthetic_profile(layers, fwd_s=fwd, model=model, batch_size=batch_size)
    return prof
