"""The worker engine's layers without sockets or processes: the key-value client
(pushpull.worker.kv_client) and the tensor pipeline (pushpull.worker.pipeline) over an in-memory
van and a server stand-in whose sum is a known function of the one push it sees."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pushpull import dtypes
from pushpull.transport.protocol import Flags, Header, Msg, MsgType, backup_extra, decode_json, encode_json
from pushpull.worker.average import Averager
from pushpull.worker.handle import Handle, PushPullError, WorkersChanged
from pushpull.worker.kv_client import KVClient
from pushpull.worker.pipeline import Pipeline
from pushpull.worker.table import (
    ASSIGNING, FAILED, INITING, NEW, PLAIN, READY, Op, TensorTable, new_stats, raw_bytes,
)


class MemoryVan:
    """The van's interface as the worker's layers use it: ``send`` queues a copy of the message,
    ``call_soon`` and ``at_pass_end`` defer calls until :meth:`Harness.pump`."""

    def __init__(self):
        self.sent: list[tuple[str, Header, list[bytes]]] = []
        self.soon: list = []
        self.pass_end: list = []

    def send(self, sid: str, header: Header, frames: list = ()) -> None:
        self.sent.append((sid, header, [bytes(memoryview(f).cast("B")) for f in frames]))

    def call_soon(self, fn) -> None:
        self.soon.append(fn)

    def at_pass_end(self, fn) -> None:
        self.pass_end.append(fn)


class MemoryMember:
    """The membership's ``send`` (to the scheduler), into the same queue as the servers' messages."""

    def __init__(self, van: MemoryVan):
        self.van = van

    def send(self, header: Header, frames: list = ()) -> None:
        self.van.send("scheduler", header, frames)


class Harness:
    """A pipeline and its key-value client over a :class:`MemoryVan`, for ``size`` workers. The server
    stand-in answers a push with ``combine(pushed values)`` as the round's sum (twice the push by default:
    what two workers pushing the same tensor would sum to)."""

    def __init__(self, size: int = 2, credit_bytes: int = 0, partition_bytes: int = 8, combine=lambda a: a * 2):
        self.van = MemoryVan()
        self.table = TensorTable()
        self.stats = new_stats()
        self.resets: list = []
        self.pipeline = Pipeline(self.table, Averager(size), self.stats, on_reset=self.resets.append)
        self.kv = KVClient(self.van, MemoryMember(self.van), 0, self.pipeline, credit_bytes)
        self.pipeline.bind(self.kv)
        self.cfg = SimpleNamespace(partition_bytes=partition_bytes, min_compress_bytes=0, max_message_bytes=64 << 20)
        self.combine = combine
        self.held: list = []

    def submit(self, name: str, tensor: torch.Tensor, average: bool = True) -> Op:
        e = self.table.entry(name, tuple(tensor.shape), dtypes.of_torch(tensor.dtype), None, PLAIN, self.cfg)
        out = torch.empty_like(tensor)
        op = Op(Handle(name, out), e, raw_bytes(tensor.contiguous()), out, raw_bytes(out), average, 0)
        op.gen = self.kv.gen  # submitted in the job's generation now (as the engine stamps it)
        e.busy = True
        self.van.call_soon(lambda: self.pipeline.start(op))
        return op

    def answer(self, sid: str, h: Header, frames: list[bytes]) -> list[Msg]:
        if h.type == MsgType.ASSIGN:
            d = decode_json(frames[0])
            return [Msg(Header(MsgType.ASSIGN_ACK, req_id=h.req_id),
                        [encode_json({"key": 100 + h.req_id, "servers": [i % 2 for i in range(len(d["parts"]))]})])]
        if h.type == MsgType.INIT:
            return [Msg(Header(MsgType.INIT_ACK, key=h.key, gen=h.gen), [])]
        if h.type == MsgType.PUSH:
            replies = []
            if not h.flags & Flags.NO_ACK:
                replies.append(Msg(Header(MsgType.PUSH_ACK, key=h.key, round=h.round, gen=h.gen), []))
            dtype = dtypes.to_torch(dtypes.BY_HEADER[h.dtype].name)
            total = self.combine(torch.frombuffer(bytearray(frames[0]), dtype=dtype)).to(dtype)
            body = total.reshape(-1).view(torch.uint8).numpy().tobytes()
            replies.append(Msg(Header(MsgType.PULL_RESP, key=h.key, round=h.round, gen=h.gen), [body]))
            return replies
        raise AssertionError(f"unexpected {h.type.name} to {sid}")

    def deliver(self, msg: Msg) -> None:
        if msg.header.type == MsgType.ASSIGN_ACK:
            self.kv.on_scheduler_message(msg)
        else:
            self.kv.on_server_message(msg)

    def pump(self, hold: frozenset = frozenset()) -> None:
        """Run deferred calls and answer every message until nothing moves; answers of a type in ``hold``
        are kept in ``held`` instead of delivered."""
        van = self.van
        while van.soon or van.sent or van.pass_end:
            soon, van.soon = van.soon, []
            for fn in soon:
                fn()
            sent, van.sent = van.sent, []
            for sid, h, frames in sent:
                for msg in self.answer(sid, h, frames):
                    (self.held.append if msg.header.type in hold else self.deliver)(msg)
            ends, van.pass_end = van.pass_end, []
            for fn in ends:
                fn()


def test_pipeline_averages_a_partitioned_tensor():
    hw = Harness(size=2, partition_bytes=8)
    x = torch.arange(10, dtype=torch.float32)
    op = hw.submit("t", x)
    hw.pump()
    assert op.handle.done() and op.handle.error is None
    assert len(op.entry.parts) == 5 and hw.stats["partitions"] == 5
    assert torch.equal(op.out, x)  # (x + x) / 2


def test_pipeline_sums_without_average():
    hw = Harness(size=2)
    x = torch.arange(6, dtype=torch.float64)
    op = hw.submit("t", x, average=False)
    hw.pump()
    assert torch.equal(op.out, 2 * x)


def test_integer_average_rounds_toward_zero_at_the_output():
    hw = Harness(size=2, combine=lambda a: a * 2 + 1)
    op = hw.submit("t", torch.tensor([3, -3, 5], dtype=torch.int32))
    hw.pump()
    assert op.out.tolist() == [3, -2, 5]  # [7, -5, 11] / 2, truncated


def test_bfloat16_is_averaged_at_the_output():
    hw = Harness(size=2, partition_bytes=4, combine=lambda a: a * 3)
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    op = hw.submit("t", x)
    hw.pump()
    assert torch.equal(op.out, x * 3 / 2)


def test_entry_states_run_new_assigning_initing_ready():
    hw = Harness()
    op = hw.submit("t", torch.ones(2))
    assert op.entry.state is NEW
    hw.pump(hold=frozenset({MsgType.ASSIGN_ACK}))
    assert op.entry.state is ASSIGNING
    hw.held, held = [], hw.held
    for msg in held:
        hw.deliver(msg)
    hw.pump(hold=frozenset({MsgType.INIT_ACK}))
    assert op.entry.state is INITING and not op.handle.done()
    hw.held, held = [], hw.held
    for msg in held:
        hw.deliver(msg)
    hw.pump()
    assert op.entry.state is READY and op.handle.done()


def test_request_ids_route_each_assign_answer_to_the_tensor_that_asked():
    hw = Harness()
    a = hw.submit("a", torch.ones(1))
    b = hw.submit("b", torch.ones(3))
    hw.pump(hold=frozenset({MsgType.ASSIGN_ACK}))
    acks, hw.held = hw.held, []
    for msg in reversed(acks):  # b's answer first
        hw.deliver(msg)
    hw.pump()
    assert all(hw.kv.parts[p.key][0] is a.entry for p in a.entry.parts)
    assert len(b.entry.parts) == 2 and all(hw.kv.parts[p.key][0] is b.entry for p in b.entry.parts)
    assert a.handle.done() and b.handle.done()


def test_credit_returns_at_push_ack():
    hw = Harness(credit_bytes=8, partition_bytes=8)
    hw.submit("t", torch.ones(8))  # 4 partitions, credit for one
    hw.pump(hold=frozenset({MsgType.PUSH_ACK, MsgType.PULL_RESP}))
    pushes = [m for m in hw.held if m.header.type == MsgType.PUSH_ACK]
    assert len(pushes) == 1 and len(hw.kv.queue) == 3
    hw.deliver(pushes[0])  # its credit back: the next partition goes out, before any pull came back
    hw.pump(hold=frozenset({MsgType.PUSH_ACK, MsgType.PULL_RESP}))
    assert len([m for m in hw.held if m.header.type == MsgType.PUSH_ACK]) == 2 and len(hw.kv.queue) == 2


def test_pushes_without_credit_ask_for_no_ack():
    hw = Harness(credit_bytes=0)
    hw.submit("t", torch.ones(2))
    hw.pump(hold=frozenset({MsgType.PULL_RESP}))
    assert not any(m.header.type == MsgType.PUSH_ACK for m in hw.held)
    assert len(hw.held) == 1


def test_answer_from_an_older_generation_is_ignored():
    hw = Harness()
    op = hw.submit("t", torch.ones(2))
    hw.pump(hold=frozenset({MsgType.PULL_RESP}))
    resp = hw.held[0]
    resp.header.gen = 1
    hw.deliver(resp)
    hw.pump()
    assert not op.handle.done() and hw.kv.inflight


def test_wrong_sized_answer_fails_the_op_naming_the_tensor():
    hw = Harness(combine=lambda a: torch.cat([a, a]))
    op = hw.submit("grad.w", torch.ones(2))
    hw.pump()
    assert op.handle.done() and "grad.w" in op.handle.error and "answered 16 bytes" in op.handle.error


def test_server_error_fails_the_tensor_and_its_later_ops():
    hw = Harness()
    op = hw.submit("t", torch.ones(2))
    hw.pump(hold=frozenset({MsgType.PULL_RESP}))
    key = op.entry.parts[0].key
    hw.deliver(Msg(Header(MsgType.ERROR, key=key), [encode_json({"error": "rank 1 declared t as int8"})]))
    hw.pump()
    assert op.entry.state is FAILED and op.handle.error == "rank 1 declared t as int8"
    op.entry.busy = False
    again = hw.submit("t", torch.ones(2))
    hw.pump()
    assert again.handle.error == "rank 1 declared t as int8"


def test_handler_failure_fails_the_op_with_its_cause():
    class Tracer:
        def admitted(self, op, p): pass
        def sent(self, p): pass
        def push_acked(self, key, rnd): pass
        def pull_received(self, key): raise RuntimeError("trace buffer full")
        def partition_done(self, op, p): pass
        def op_done(self, op, error): pass

    hw = Harness()
    hw.pipeline.tracer = Tracer()
    hw.kv.trace_ack = hw.pipeline.tracer.push_acked
    op = hw.submit("t", torch.ones(2))
    hw.pump()
    assert "tensor 't'" in op.handle.error and "PULL_RESP failed" in op.handle.error
    assert "trace buffer full" in op.handle.error and not hw.kv.inflight


def test_backup_round_is_averaged_over_the_pushes_it_holds():
    hw = Harness(size=4)
    x = torch.full((2,), 6.0)
    op = hw.submit("t", x)
    hw.pump(hold=frozenset({MsgType.PULL_RESP}))
    resp = hw.held[0]
    resp.header.extra = backup_extra(3, 0)  # the server summed three pushes, not four
    resp.frames = [np.full(2, 18.0, dtype=np.float32).tobytes()]
    hw.deliver(resp)
    hw.pump()
    assert torch.equal(op.out, x)


def test_the_caller_sees_the_error_as_pushpullerror():
    hw = Harness(combine=lambda a: a[:1])
    op = hw.submit("t", torch.ones(2))
    hw.pump()
    with pytest.raises(PushPullError, match="answered 4 bytes"):
        op.handle.wait(1.0)


def test_compressed_backup_round_is_averaged_over_the_pushes_it_holds():
    hw = Harness(size=4)
    x = torch.full((2,), 6.0)
    e = hw.table.entry("t", (2,), dtypes.BY_NAME["float32"], {"compressor": "fp16"}, PLAIN, hw.cfg)
    out = torch.empty_like(x)
    op = Op(Handle("t", out), e, raw_bytes(x), out, raw_bytes(out), True, 0)
    e.busy = True
    hw.van.call_soon(lambda: hw.pipeline.start(op))
    hw.pump(hold=frozenset({MsgType.PULL_RESP}))
    resp = hw.held[0]
    resp.header.flags |= Flags.COMPRESSED
    resp.header.extra = backup_extra(3, 0)  # the server summed three pushes, not four
    codec = e.parts[0].codec
    resp.frames = [bytes(memoryview(codec.compress(raw_bytes(torch.full((2,), 18.0)))).cast("B"))]
    hw.deliver(resp)
    hw.pump()
    assert op.handle.error is None and torch.equal(op.out, x)


# ---------------------------------------------------------------- shared memory (pushpull.transport.shm) --

class ShmHarness(Harness):
    """The same stand-in, its servers on this host: INIT_ACK gives each key a real region in /dev/shm, and a
    push flagged SHM is read from this rank's slot and answered in output ``round % 2``, as a server does."""

    def __init__(self, **kw):
        from pushpull.transport import shm

        super().__init__(**kw)
        self.regions = shm.Regions()
        self.kv.shm_socks = {"s0", "s1"}
        self.kv.num_workers = 2
        self.kv.shm_min_bytes = 0
        self.stats["shm_pushes"] = 0
        self.pushes: list[Header] = []

    def answer(self, sid, h, frames):
        if h.type == MsgType.INIT:
            region = self.regions.create(h.key, h.numel * 4, 1)
            return [Msg(Header(MsgType.INIT_ACK, key=h.key, gen=h.gen), [encode_json({"shm": region.describe(0)})])]
        if h.type == MsgType.PUSH and h.flags & Flags.SHM:
            self.pushes.append(h)
            region = self.regions.named[h.key]
            total = self.combine(torch.from_numpy(region.push(0).view(np.float32).copy()))
            region.out(h.round % 2).view(np.float32)[:] = total.numpy()
            return [Msg(Header(MsgType.PULL_RESP, key=h.key, round=h.round, gen=h.gen, flags=Flags.SHM,
                               extra=h.round % 2), [b""])]
        if h.type == MsgType.PUSH:
            self.pushes.append(h)
        return super().answer(sid, h, frames)


@pytest.fixture
def shm_harness():
    hw = ShmHarness(size=2, partition_bytes=16)
    yield hw
    hw.regions.unlink_all()


def test_a_push_through_shared_memory_carries_no_body_and_its_sum_is_read_from_the_output(shm_harness):
    hw = shm_harness
    for rnd in (1, 2, 3):  # both outputs, then the first again
        x = torch.arange(8, dtype=torch.float32) * rnd
        op = hw.submit("t", x)
        hw.pump()
        assert op.handle.error is None and torch.equal(op.out, x)  # (x + x) / 2
    assert len(hw.pushes) == 6 and all(h.flags & Flags.SHM for h in hw.pushes)
    assert hw.stats["shm_pushes"] == 6


def test_an_answer_naming_an_output_the_key_lacks_fails_the_op(shm_harness):
    hw = shm_harness
    op = hw.submit("t", torch.ones(4))
    hw.pump(hold=frozenset({MsgType.PULL_RESP}))
    resp = hw.held[0]
    resp.header.extra = 7
    hw.deliver(resp)
    hw.pump()
    assert "shared memory output 7" in op.handle.error


def test_after_a_failed_op_its_partitions_still_out_push_over_the_socket(shm_harness):
    """A failed op's partition whose push may still wait at its server (unread, or held for the sum) must not
    have its slot overwritten by the next op: from then on it pushes in the message body. A partition
    answered before the failure keeps its slot."""
    hw = shm_harness
    op = hw.submit("t", torch.ones(12))  # three partitions
    hw.pump(hold=frozenset({MsgType.PULL_RESP}))
    good, bad, out = hw.held
    hw.held = []
    hw.deliver(good)
    bad.header.extra = 7  # this answer fails the op; the third partition is still at its server
    hw.deliver(bad)
    hw.pump()
    assert op.handle.error
    part = {p.key: p for p in op.entry.parts}
    assert part[good.header.key].shm_push is not None
    assert part[bad.header.key].shm_push is None and part[out.header.key].shm_push is None
    hw.pushes.clear()
    op2 = hw.submit("t", torch.full((12,), 3.0))
    hw.pump()
    assert op2.handle.error is None and torch.equal(op2.out, torch.full((12,), 3.0))
    flagged = {h.key: bool(h.flags & Flags.SHM) for h in hw.pushes}
    assert flagged == {good.header.key: True, bad.header.key: False, out.header.key: False}


def _inits(hw: Harness) -> list:
    return [(sid, h.key) for sid, h, _ in hw.van.sent if h.type == MsgType.INIT]


def _ready_then_moved(hw: Harness) -> Op:
    """A tensor declared and used once, whose partition 0 then moves to server 1 with a change of the job."""
    op = hw.submit("t", torch.ones(2))
    hw.pump()
    assert op.entry.state is READY
    hw.kv.gen = 1
    hw.pipeline.restart("the job changed", {op.entry.parts[0].key: 1})
    return op


def test_a_moved_partition_is_declared_again_by_its_next_op_not_at_the_change():
    """A rank that came in after the others declared a tensor never declares it where it moved, so a
    declaration sent at the change would wait for it until the timeout and then fail the tensor for its next
    use (the chaos run's third failure); declared by its next op, it waits only for the ranks that use it."""
    hw = Harness()
    op = _ready_then_moved(hw)
    assert op.entry.state is INITING and op.entry.declare_later and _inits(hw) == []
    again = hw.submit("t", torch.ones(2))
    hw.van.soon.pop()()  # start the op: its declaration goes out with it
    assert _inits(hw) == [("s1", op.entry.parts[0].key)]
    hw.pump()
    assert again.handle.done() and again.handle.error is None and op.entry.state is READY


def test_a_moved_partition_with_a_seed_is_declared_where_it_moved_at_the_change():
    """DiLoCo's outer keys (and asynchronous training's) have seeds, and their workers are not at the same point
    after a change: one that took a round's answer before it moves on to another key's round, which waits for
    the workers retrying this key, which would wait for its declaration by that one's next op (the flaky
    test_a_lost_servers_outer_state_is_seeded_from_the_workers[streaming-overlap], 2 runs of 17)."""
    hw = Harness()
    op = hw.submit("t", torch.ones(2))
    hw.pump()
    hw.pipeline.table.seeds["t"] = (1, np.ones(2, np.float32), None)
    hw.kv.gen = 1
    hw.pipeline.restart("the job changed", {op.entry.parts[0].key: 1})
    assert _inits(hw)[-1] == ("s1", op.entry.parts[0].key) and not op.entry.declare_later
    hw.pump()
    assert op.entry.state is READY and not op.entry.parts[0].moved


def test_a_moved_partition_keeps_its_seed_flag_until_the_server_acknowledges_it():
    """Sent again after another change (its first INIT answered by no one), a moved outer key's declaration must
    still carry its seed."""
    hw = Harness()
    op = _ready_then_moved(hw)
    part = op.entry.parts[0]
    hw.submit("t", torch.ones(2))
    hw.pump(hold=frozenset({MsgType.INIT_ACK}))
    assert part.moved and not part.inited
    hw.kv.gen = 2
    hw.pipeline.restart("the job changed again", {})
    hw.held = []
    assert part.moved and op.entry.declare_later
    hw.submit("t", torch.ones(2))
    hw.pump()
    assert part.inited and not part.moved


def test_a_placement_that_arrives_after_a_change_failed_its_op_is_declared_by_the_next_op():
    hw = Harness()
    op = hw.submit("t", torch.ones(2))
    hw.pump(hold=frozenset({MsgType.ASSIGN_ACK}))
    hw.kv.gen = 1
    hw.pipeline.restart("the job changed", {})
    hw.pump()
    assert op.handle.done() and op.handle.error is not None
    held, hw.held = hw.held, []
    for msg in held:
        hw.deliver(msg)
    assert op.entry.state is INITING and op.entry.declare_later and _inits(hw) == []
    again = hw.submit("t", torch.ones(2))
    hw.pump()
    assert again.handle.done() and again.handle.error is None and op.entry.state is READY


def test_an_op_whose_partitions_all_wait_for_credit_fails_at_a_change_and_frees_its_tensor():
    """On no wire yet, it is in neither the in-flight map nor its tensor's waiting list; left alone it would go
    out after the change as a round no other worker pushes, with its tensor busy when the caller pushes it again."""
    hw = Harness(credit_bytes=8, partition_bytes=8)
    first = hw.submit("a", torch.ones(2))  # 8 bytes: the whole credit
    waiting = hw.submit("b", torch.ones(2))
    hw.pump(hold=frozenset({MsgType.PUSH_ACK, MsgType.PULL_RESP}))
    assert len(hw.kv.queue) == 1 and not any(op is waiting for op in hw.kv.inflight.values())
    hw.kv.gen = 1
    hw.pipeline.restart("the job changed", {})
    hw.pump()
    for op in (first, waiting):
        assert op.handle.done() and op.handle.error_type is WorkersChanged and "the job changed" in op.handle.error
        assert not op.entry.busy
    assert hw.kv.queue.in_flight == 0
