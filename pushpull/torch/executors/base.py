"""The strategy interface, in the spirit of PyTorch's DDP comm hooks: small
objects that receive ready gradients and hand back reduced ones.

Every strategy turns gradients into *tasks*: one reduction on the wire that
carries one gradient (WFBP, ByteScheduler) or several packed into one flat
buffer (BSP, fusion, MG-WFBP). :meth:`Strategy._launch` is the single place
where a task starts and :meth:`Strategy._complete` the single place where it
ends (reduced values written back into the gradients), so tracing and
layer-wise updates hook in there and nowhere else.
"""
from __future__ import annotations

import time

import torch

from pushpull.torch.executors.comm import Comm, make_comm


class Task:
    """One reduction: ``members`` are (name, grad) pairs; ``buffer`` is the flat
    fused buffer, or None when the task reduces a single gradient in place."""

    __slots__ = ("name", "members", "buffer", "priority", "token", "finished", "t_start", "t_end")

    def __init__(self, name: str, members: list, buffer: torch.Tensor | None, priority: int):
        self.name = name
        self.members = members
        self.buffer = buffer
        self.priority = priority
        self.token = None
        self.finished = False
        self.t_start = 0.0
        self.t_end = 0.0

    @property
    def nbytes(self) -> int:
        t = self.buffer if self.buffer is not None else self.members[0][1]
        return t.numel() * t.element_size()


class Strategy:
    """Receives gradients as autograd produces them and reduces them in place.

    ``on_ready`` is called from the autograd thread as soon as a gradient is
    final for this step; ``wait_all`` blocks until every gradient submitted
    since the last call is averaged over all workers, written back into the
    same tensor. ``priority``: larger is more urgent (the layer nearest the
    input has the largest). ``compression``: what :func:`pushpull.worker.compression.normalize` returns
    (None, a wire compressor or a Horovod-style one), or a spec dict.

    Layer-wise updates also use ``wait(name)`` (block for one gradient) and
    ``done(name)`` (has it arrived?); they need ``on_backward_done`` to have
    been called for the step, since fused strategies may hold gradients back
    until then. ``backend`` ('ps' | 'allreduce', default PUSHPULL_BACKEND) picks
    the reduction path; ``comm`` may be passed instead (tests, benchmarks).
    """

    name = "base"

    def __init__(self, compression=None, backend: str | None = None, comm: Comm | None = None, **options):
        self.compression = compression
        self.options = options
        self.comm = comm if comm is not None else make_comm(backend, compression)
        self.backend = self.comm.backend
        self._active: list[Task] = []             # launched, not yet completed, in launch order
        self._task_of: dict[str, Task] = {}        # gradient name -> its latest task
        self._buffers: dict[str, torch.Tensor] = {}  # fused buffers, reused across steps
        self._sched = tuple(self.scheduling())
        self._apply_scheduling()

    # the backend's credit is process-wide: with several strategies alive (benchmarks),
    # each re-applies its own before launching if another one changed it
    _applied: dict = {}

    def _apply_scheduling(self) -> None:
        key = self.comm.scope()
        if Strategy._applied.get(key) != self._sched:
            self.comm.set_scheduling(*self._sched)
            Strategy._applied[key] = self._sched

    def scheduling(self) -> tuple[int, int]:
        """(partition bytes, credit bytes) this strategy wants from the backend."""
        return self.comm.default_scheduling()

    # ------------------------------------------------------------ interface --
    def on_ready(self, name: str, grad: torch.Tensor, priority: int) -> None:
        raise NotImplementedError

    def on_backward_done(self) -> None:
        """All gradients of this step have been submitted (called before ``wait_all``)."""

    def wait_all(self) -> None:
        """Complete every launched task, in launch order."""
        self._flush()
        active, self._active = self._active, []
        for task in active:
            self._complete(task)
        self._task_of.clear()
        if active and not getattr(self, "_keys_checked", False):   # the first step's tensors are all declared
            self._keys_checked = True
            check = getattr(self.comm, "check_keys", None)
            if check is not None:
                check()

    def _flush(self) -> None:
        """Strategies that hold gradients back launch them here (idempotent)."""

    def reset(self) -> None:
        """Drop the step in progress (elastic training: its reductions failed with WorkersChanged).
        Strategies that hold more per-step state extend this."""
        self._active = []
        self._task_of.clear()

    def wait(self, name: str) -> None:
        """Block until gradient ``name`` of the current step is reduced and written back."""
        task = self._task_of.get(name)
        if task is None:
            raise KeyError(f"strategy {self.name!r}: gradient {name!r} was not launched; was on_ready called "
                           f"for it and on_backward_done after the last one?")
        if not task.finished:
            self._complete(task)

    def done(self, name: str) -> bool:
        """True when ``wait(name)`` would not block."""
        task = self._task_of.get(name)
        return task is not None and (task.finished or self.comm.poll(task.token))

    def pending(self) -> int:
        """How many launched tasks are not completed yet."""
        return sum(1 for t in self._active if not t.finished)

    # ------------------------------------------------------------ task start / end --
    def _launch(self, name: str, members: list, priority: int) -> Task:
        """Start one reduction of ``members`` [(grad name, grad)]: one gradient goes
        in place, several are packed into a reused flat buffer called ``name``."""
        if len(members) == 1:
            task = Task(name, members, None, priority)
            tensor = members[0][1]
        else:
            total = sum(g.numel() for _, g in members)
            first = members[0][1]
            buf = self._buffers.get(name)
            if buf is None or buf.numel() != total or buf.dtype != first.dtype or buf.device != first.device:
                buf = torch.empty(total, dtype=first.dtype, device=first.device)
                self._buffers[name] = buf
            torch.cat([g.reshape(-1) for _, g in members], out=buf)
            task = Task(name, members, buf, priority)
            tensor = buf
        self._apply_scheduling()
        task.t_start = time.perf_counter()
        task.token = self.comm.submit(tensor, name, priority)
        self._active = [t for t in self._active if not t.finished]
        self._active.append(task)
        for n, _ in members:
            self._task_of[n] = task
        return task

    def _complete(self, task: Task) -> None:
        """Wait for ``task`` and write the reduced values back into its gradients."""
        if task.finished:
            return
        self.comm.wait(task.token)
        if task.buffer is not None:
            off = 0
            for _, g in task.members:
                n = g.numel()
                g.copy_(task.buffer[off:off + n].view_as(g))
                off += n
        task.finished = True
        task.t_end = time.perf_counter()

    def _launch_packed(self, label: str, members: list, priority: int) -> list[Task]:
        """Launch ``members`` as fused buffers, one per (dtype, device): a flat
        buffer holds one dtype. A buffer is named after its label, first
        gradient and size, so the name is the same on every worker and across
        steps, and differs between different buffers."""
        groups: dict[tuple, list] = {}
        for n, g in members:
            groups.setdefault((g.dtype, g.device), []).append((n, g))
        tasks = []
        for ms in groups.values():
            if len(ms) == 1:
                tasks.append(self._launch(ms[0][0], ms, priority))
            else:
                tasks.append(self._launch(f"{label}[{ms[0][0]}+{len(ms) - 1}]", ms, priority))
        return tasks
