"""What a communication strategy *is*, independent of who carries it out.

A strategy decides which gradients travel together, when each message may leave, and how the backend
cuts and admits them. Those decisions are pure functions of the gradients' ready times and sizes, so
they live here once, and two executors carry them out: the runtime (:mod:`pushpull.torch.executors`,
on real tensors and sockets) and the simulator (:mod:`pushpull.sim.executors`, on a model profile).
Before, each strategy was written twice and the simulator could silently disagree with what ran.

This package imports neither torch nor the simulator. A new strategy is one file in it with one
:class:`Policy` subclass: the registry (:mod:`pushpull.policy`) finds it, and the runtime, the
simulator, the benchmark grid and the ``PUSHPULL_STRATEGY`` validation all accept its name.
"""
from __future__ import annotations

from typing import Any, ClassVar

RELEASES = ("ready", "end", "plan")
OWN = "own"     # Policy.runtime / .simulator: an executor of its own, registered for the name (register_executor)
ABSENT = "-"    # ... not available there
TAIL_FOLD = 8  # a tensor's last piece under 1/TAIL_FOLD of a key joins the key before it (key_sizes)


def key_sizes(nbytes: int, key_bytes: int, itemsize: int = 1, cap: int | None = None) -> list[int]:
    """The sizes of the keys (partitions) a tensor of ``nbytes`` is cut into, for the runtime and the
    simulator alike: ``key_bytes`` each (whole elements of ``itemsize``), except that a last piece under
    1/:data:`TAIL_FOLD` of a key joins the key before it, where the sum stays within ``cap``. Why: such a
    tail costs a push, a pull and the server's per-message work for little data (16 tensors of 4 MiB cut
    at BytePS's 4,096,000 bytes: every tensor a 4 MB key and a 96 KiB one; the servers spent 1.33x a gloo
    rank's CPU per byte, 1.18x with one key per tensor; docs/results/line_rate.md). Empty: no keys."""
    p = max(itemsize, int(key_bytes) // itemsize * itemsize)
    sizes = [min(p, nbytes - off) for off in range(0, nbytes, p)]
    if len(sizes) > 1 and sizes[-1] * TAIL_FOLD < p and (cap is None or sizes[-2] + sizes[-1] <= cap):
        tail = sizes.pop()
        sizes[-1] += tail
    return sizes



class Policy:
    """A strategy's decisions. Subclasses set ``name`` and override what they decide.

    * ``release``: ``"ready"``: every gradient is reduced on its own as soon as it is ready;
      ``"end"``: all of them as one buffer after the backward pass; ``"plan"``: in the buffers
      :meth:`plan` groups them into (each launched when its last gradient is ready; the runtime measures
      the ready times during warm-up steps and agrees on rank 0's).
    * ``schedules``: the backend cuts messages into partitions, queues them by priority and admits
      them under a credit, with the sizes :meth:`scheduling` gives (ByteScheduler's mechanism); its
      options for them are called ``partition_bytes`` and ``credit`` (bytes), as the grid passes them.
    * ``options``: option name -> default (None: the default comes from a setting or the backend);
      the runtime and the simulator accept these as keyword options.
    * ``runtime`` / ``simulator``: :data:`OWN` where the generic executor does not do (a cost model
      measured on the live backend, a layer-wise view of a profile): an executor of its own registers
      itself for the name (:func:`pushpull.policy.register_executor`); None = the generic executor;
      :data:`ABSENT` (``"-"``) = not available there.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    order: ClassVar[int] = 100          # listing order (names, --strategy defaults); ties by name
    release: ClassVar[str] = "ready"
    schedules: ClassVar[bool] = False
    options: ClassVar[dict[str, Any]] = {}
    runtime: ClassVar[str | None] = None
    simulator: ClassVar[str | None] = None
    fixed: ClassVar[bool] = True        # False: picks another strategy at run time (auto)

    @classmethod
    def plan(cls, ready_s: list[float], sizes: list[int], **options) -> list[list[int]]:
        """``release == "plan"``: group gradients given in ready order (their ready times in seconds
        from the first one, and their sizes in bytes) into buffers; lists of indices in launch order."""
        raise NotImplementedError(f"strategy {cls.name!r} releases {cls.release!r}: it has no plan")

    @classmethod
    def scheduling(cls, backend: str, **options) -> tuple[int, float]:
        """``schedules``: (partition bytes, credit bytes) on ``backend`` with these options (None = default)."""
        raise NotImplementedError(f"strategy {cls.name!r} keeps the backend's own partitioning and credit")

    @classmethod
    def describe(cls) -> str:
        return (cls.__doc__ or cls.name).strip().splitlines()[0]
