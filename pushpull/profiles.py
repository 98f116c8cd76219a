"""Model profiles: what the simulator and the emulated-compute benchmarks replay.

A profile lists a model's layers in *forward* order; each layer has its forward
and backward compute time (seconds, for one worker's local batch) and the
gradient tensors it owns. It is plain JSON so that a profile measured on a GPU
machine can be replayed on a laptop. Format (``pushpull-profile/1``)::

    {
      "format": "pushpull-profile/1",
      "model": "resnet50",
      "batch_size": 32,
      "device": "cpu" | "cuda:<name>" | "synthetic",
      "source": "measured" | "shapes",
      "layers": [
        {"name": "conv1", "fwd_s": 0.0012, "bwd_s": 0.0024,
         "tensors": [{"name": "conv1.weight", "numel": 9408, "dtype": "float32"}]}
      ]
    }

Pure Python, no torch import: the simulator must stay light.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from pushpull import dtypes

FORMAT = "pushpull-profile/1"

DTYPE_BYTES = {n: dtypes.NBYTES[n] for n in dtypes.TENSOR_NAMES}  # what a push_pull carries -> bytes per element


class ProfileError(ValueError):
    """A profile file is malformed; the message names the file and the field."""


@dataclass
class TensorSpec:
    name: str
    numel: int
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass
class LayerProfile:
    name: str
    fwd_s: float
    bwd_s: float
    tensors: list[TensorSpec] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)


@dataclass
class Profile:
    model: str
    layers: list[LayerProfile]
    batch_size: int = 1
    device: str = "synthetic"
    source: str = "shapes"

    # -- totals -------------------------------------------------------------
    @property
    def fwd_s(self) -> float:
        return sum(l.fwd_s for l in self.layers)

    @property
    def bwd_s(self) -> float:
        return sum(l.bwd_s for l in self.layers)

    @property
    def compute_s(self) -> float:
        return self.fwd_s + self.bwd_s

    @property
    def nbytes(self) -> int:
        return sum(l.nbytes for l in self.layers)

    @property
    def numel(self) -> int:
        return sum(l.numel for l in self.layers)

    def tensors(self) -> Iterable[TensorSpec]:
        for layer in self.layers:
            yield from layer.tensors

    # -- transforms -----------------------------------------------------------
    def scaled(self, compute_factor: float) -> "Profile":
        """Same tensors, compute times multiplied by ``compute_factor``.

        A GPU k times faster than the profiled device is ``scaled(1/k)``; this
        is how benchmarks set the computation-to-communication ratio.
        """
        if compute_factor <= 0:
            raise ValueError(f"compute_factor must be > 0, got {compute_factor}")
        return Profile(
            model=self.model,
            batch_size=self.batch_size,
            device=self.device,
            source=self.source,
            layers=[
                LayerProfile(l.name, l.fwd_s * compute_factor, l.bwd_s * compute_factor, list(l.tensors))
                for l in self.layers
            ],
        )

    def with_compute(self, total_compute_s: float) -> "Profile":
        """Rescale compute so that forward+backward takes ``total_compute_s``."""
        if self.compute_s <= 0:
            raise ValueError(f"profile {self.model!r} has zero compute time; cannot rescale")
        return self.scaled(total_compute_s / self.compute_s)

    # -- (de)serialisation ----------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "model": self.model,
            "batch_size": self.batch_size,
            "device": self.device,
            "source": self.source,
            "layers": [
                {
                    "name": l.name,
                    "fwd_s": l.fwd_s,
                    "bwd_s": l.bwd_s,
                    "tensors": [{"name": t.name, "numel": t.numel, "dtype": t.dtype} for t in l.tensors],
                }
                for l in self.layers
            ],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, d: dict, origin: str = "<dict>") -> "Profile":
        if d.get("format") != FORMAT:
            raise ProfileError(f"{origin}: 'format' must be {FORMAT!r}, got {d.get('format')!r}")
        layers = []
        for i, ld in enumerate(d.get("layers", [])):
            try:
                tensors = [TensorSpec(str(t["name"]), int(t["numel"]), str(t.get("dtype", "float32")))
                           for t in ld.get("tensors", [])]
                for t in tensors:
                    if t.dtype not in DTYPE_BYTES:
                        raise ProfileError(f"{origin}: layer {i} tensor {t.name!r}: unknown dtype {t.dtype!r}")
                    if t.numel < 0:
                        raise ProfileError(f"{origin}: layer {i} tensor {t.name!r}: numel < 0")
                layer = LayerProfile(str(ld["name"]), float(ld["fwd_s"]), float(ld["bwd_s"]), tensors)
            except KeyError as e:
                raise ProfileError(f"{origin}: layer {i} lacks field {e.args[0]!r}") from None
            if layer.fwd_s < 0 or layer.bwd_s < 0:
                raise ProfileError(f"{origin}: layer {i} ({layer.name!r}) has a negative time")
            layers.append(layer)
        if not layers:
            raise ProfileError(f"{origin}: profile has no layers")
        return cls(
            model=str(d.get("model", "unknown")),
            layers=layers,
            batch_size=int(d.get("batch_size", 1)),
            device=str(d.get("device", "synthetic")),
            source=str(d.get("source", "shapes")),
        )

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ProfileError(f"{p}: not valid JSON ({e})") from None
        return cls.from_dict(d, origin=str(p))


BUILTIN_DIR = Path(__file__).parent / "data" / "profiles"


def builtin_names() -> list[str]:
    """Names of the profiles shipped with pushpull (``pushpull/data/profiles``)."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.json"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name (``resnet50``) or any profile file by path."""
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        return Profile.load(p)
    candidate = BUILTIN_DIR / f"{name_or_path}.json"
    if not candidate.exists():
        raise ProfileError(f"no profile named {str(name_or_path)!r}; shipped: {', '.join(builtin_names()) or 'none'}")
    return Profile.load(candidate)
