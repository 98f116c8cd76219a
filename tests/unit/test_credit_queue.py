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


def test_auto_window_stays_at_its_floor_on_a_short_path():
    """Round trips of a partition's own transmission (no path delay): twice the product is under the floor."""
    from pushpull.worker.window import AutoWindow

    w = AutoWindow(floor=256_000, cap=4_000_000, clock=_Clock())
    for _ in range(50):  # 256 KB in flight, 12.5 MB/s link: ~20 ms queueing, 5 ms minimum
        w.on_ack(256_000, 0.020)
    w.on_ack(65_536, 0.005)
    assert w.bytes == 256_000


def test_auto_window_grows_to_twice_the_bandwidth_delay_product():
    """A 10 ms round trip at 25 MB/s: the window grows from its floor to ~2 x 250 KB and stops there."""
    from pushpull.worker.window import AutoWindow

    rate, rtt0 = 25e6, 0.010
    w = AutoWindow(floor=256_000, cap=10_000_000, clock=_Clock())
    for _ in range(40):  # what a path of that rate and delay answers for the window in force:
        in_flight = w.bytes  # all of it is acknowledged within one round trip
        rtt = max(rtt0, in_flight / rate)
        w.on_ack(in_flight, rtt)
    assert abs(w.bytes - 2 * rate * rtt0) / (2 * rate * rtt0) < 0.05


def test_auto_window_is_capped_and_forgets_old_samples():
    from pushpull.worker.window import HORIZON_S, AutoWindow

    clock = _Clock()
    w = AutoWindow(floor=100_000, cap=1_000_000, clock=clock)
    w.on_ack(1_000_000, 0.001)      # 1 GB/s x ... -> capped
    assert w.bytes == 1_000_000
    for _ in range(3):              # a horizon later only the new, slower samples count
        clock.t += HORIZON_S / 2 + 0.1
        w.on_ack(100_000, 0.050)
    assert w.bytes == 200_000       # 2 x 2 MB/s x 50 ms
