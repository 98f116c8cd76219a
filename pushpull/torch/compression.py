"""Horovod's ``pushpull.torch.compression`` module: the framework-neutral compression argument
(:mod:`pushpull.worker.compression`) under the name torch scripts import it by."""
from pushpull.worker.compression import Compression, Compressor  # noqa: F401
