"""CreditQueue (pushpull/worker/credit_queue.py): priority order, preemption of
queued work by a late urgent partition, and the in-flight bound."""
import random

import pytest

from pushpull.worker.credit_queue import CreditQueue

PART = 1000


def drain(q: CreditQueue, started: list) -> None:
    q.admit(lambda item, nb: started.append(item))


def test_late_high_priority_partition_overtakes_every_queued_lower_one():
    q = CreditQueue(credit_bytes=2 * PART)
    started: list = []
    for part in range(8):                       # a late layer (low priority) is ready first
        q.push(("late_layer", part), PART, priority=-9, part=part)
    drain(q, started)
    assert started == [("late_layer", 0), ("late_layer", 1)]   # credit: two partitions in flight
    for part in range(3):                       # the input layer becomes ready later
        q.push(("input_layer", part), PART, priority=0, part=part)
    # nothing in flight is interrupted; each completion admits the most urgent queued partition
    for _ in range(3):
        q.release(PART)
        drain(q, started)
    assert started[2:5] == [("input_layer", 0), ("input_layer", 1), ("input_layer", 2)]
    while len(q):
        q.release(PART)
        drain(q, started)
    assert started[5:] == [("late_layer", p) for p in range(2, 8)]


def test_ties_go_by_partition_index_then_arrival():
    q = CreditQueue(0)
    started: list = []
    q.push("b1", 10, priority=1, part=1)
    q.push("a0", 10, priority=1, part=0)
    q.push("c1", 10, priority=1, part=1)
    q.push("z", 10, priority=5, part=7)
    drain(q, started)
    assert started == ["z", "a0", "b1", "c1"]


@pytest.mark.parametrize("seed", range(5))
def test_bytes_in_flight_never_exceed_credit_plus_one_partition(seed):
    rng = random.Random(seed)
    credit = rng.choice([1, 500, 3 * PART, 10 * PART])
    q = CreditQueue(credit)
    in_flight: list[int] = []
    for _ in range(2000):
        if rng.random() < 0.55:
            q.push(object(), rng.randint(1, PART), priority=rng.randint(-20, 0), part=rng.randint(0, 5))
        elif in_flight:
            q.release(in_flight.pop(rng.randrange(len(in_flight))))
        q.admit(lambda item, nb: in_flight.append(nb))
        assert q.in_flight == sum(in_flight)
        assert q.in_flight <= credit + PART
        # never idle with work queued while credit is left
        assert not (len(q) and q.in_flight < credit)
    assert q.max_in_flight <= credit + PART


def test_zero_credit_means_unlimited_and_double_release_is_caught():
    q = CreditQueue(0)
    started: list = []
    for i in range(100):
        q.push(i, PART, priority=-i)
    drain(q, started)
    assert started == list(range(100)) and q.in_flight == 100 * PART
    q.in_flight = 0
    with pytest.raises(AssertionError, match="twice"):
        q.release(1)


# ---------------------------------------------------------------- the auto window --

class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _path(w, clock, rate, rtt0, part=65_536, acks=400):
    """Drive ``w`` over a path of ``rate`` bytes/s and propagation round trip ``rtt0``: pushes go out while
    the window allows, serialised at the rate; each is acknowledged ``rtt0`` after it left."""
    link_free, in_flight, n = 0.0, [], 0
    while n < acks:
        while (len(in_flight) + 1) * part <= w.bytes:
            link_free = max(clock.t, link_free) + part / rate
            in_flight.append((link_free + rtt0, clock.t))
        ack_at, t_sent = in_flight.pop(0)
        clock.t = max(clock.t, ack_at)
        w.on_ack(part, clock.t - t_sent)
        n += 1


def test_auto_window_stays_at_its_floor_on_a_short_path():
    """No path delay (the emulated grid's namespaces): twice the product is under the floor."""
    from pushpull.worker.window import AutoWindow

    clock = _Clock()
    w = AutoWindow(floor=262_144, cap=4_194_304, clock=clock)
    _path(w, clock, rate=25e6, rtt0=0.0002)
    assert w.bytes == 262_144


def test_auto_window_bunched_acknowledgements_do_not_inflate_the_rate():
    """What the 200 Mbit/s grid showed: a link of 25 MB/s, acknowledgements in bunches of four 64 KiB
    partitions every 10.5 ms, the last of each sent just before its bunch came back (1.2 ms round trip).
    Counting the bunch over that push's round trip measured 218 MB/s and doubled the window; the rate
    over two windows of acknowledgements is the link's, and the window stays at its floor."""
    from pushpull.worker.window import AutoWindow

    clock = _Clock()
    w = AutoWindow(floor=262_144, cap=4_194_304, clock=clock)
    for _ in range(100):
        clock.t += 0.0105
        for rtt in (0.0105, 0.008, 0.005, 0.0012):
            w.on_ack(65_536, rtt)
    assert w.bytes == 262_144


def test_auto_window_grows_to_twice_the_bandwidth_delay_product():
    """A 10 ms round trip at 25 MB/s: the window grows from its floor to ~2 x the product and stops there."""
    from pushpull.worker.window import AutoWindow

    rate, rtt0, part = 25e6, 0.010, 65_536
    clock = _Clock()
    w = AutoWindow(floor=262_144, cap=10_000_000, clock=clock)
    _path(w, clock, rate=rate, rtt0=rtt0, part=part)
    bdp = rate * (rtt0 + part / rate)  # the smallest round trip includes one partition's transmission
    assert abs(w.bytes - 2 * bdp) / (2 * bdp) < 0.1


def test_auto_window_is_capped_and_forgets_old_samples():
    from pushpull.worker.window import HORIZON_S, AutoWindow

    clock = _Clock()
    w = AutoWindow(floor=100_000, cap=1_000_000, clock=clock)
    for _ in range(30):             # 100 KB every 0.1 ms (1 GB/s), 1 ms round trips: 2 MB -> capped
        clock.t += 0.0001
        w.on_ack(100_000, 0.001)
    assert w.bytes == 1_000_000
    for _ in range(3):              # a horizon later only the new, slower samples count:
        clock.t += HORIZON_S / 2 + 0.1
        for _ in range(30):         # 100 KB every 50 ms (2 MB/s), 50 ms round trips
            clock.t += 0.05
            w.on_ack(100_000, 0.050)
    assert abs(w.bytes - 200_000) <= 1  # 2 x 2 MB/s x 50 ms


def test_ready_order_admits_in_arrival_order_whatever_the_priority():
    """by_priority=False (the engine's auto window, which only paces): a worker's pushes leave in the order
    they became ready, the same on every worker, however its credit happens to free up."""
    q = CreditQueue(credit_bytes=2 * PART, by_priority=False)
    started: list = []
    for part in range(4):
        q.push(("late_layer", part), PART, priority=-9, part=part)
    drain(q, started)
    q.push(("input_layer", 0), PART, priority=0, part=0)
    q.push(("input_layer", 1), PART, priority=0, part=1)
    while len(q):
        q.release(PART)
        drain(q, started)
    assert started == [("late_layer", p) for p in range(4)] + [("input_layer", 0), ("input_layer", 1)]


def _engine_queue_order(scheduling_credit, layerwise=False):
    """Engine._use_default_credit on an engine with its servers on other hosts, without sockets."""
    from types import SimpleNamespace

    from pushpull.config import load_config
    from pushpull.worker.engine import Engine

    eng = Engine.__new__(Engine)
    eng.cfg = load_config({} if scheduling_credit is None else {"BYTEPS_SCHEDULING_CREDIT": scheduling_credit})
    eng.servers_local, eng.num_servers = False, 2
    eng._auto_window, eng._layerwise = None, layerwise
    eng.kv = SimpleNamespace(queue=CreditQueue(0), window=None)
    eng._use_default_credit()
    return eng.kv.queue.by_priority


@pytest.mark.parametrize("credit, layerwise, by_priority", [
    (None, False, False),   # the auto window only paces: ready order
    ("4", False, True),     # a credit set by hand is scheduling, as in BytePS: priority order
    (None, True, True),     # layer-wise updates: the next forward wants the first layers first
], ids=["auto-window", "hand-set-credit", "layer-wise"])
def test_the_engine_orders_by_priority_only_where_scheduling_was_asked_for(credit, layerwise, by_priority):
    assert _engine_queue_order(credit, layerwise) is by_priority
