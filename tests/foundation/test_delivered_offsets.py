"""``schemas.control.DeliveredOffsets``: what a mark says is delivered (the cluster watcher's state
marks, the replay driver's watermark marks). A mark that names an offset not yet delivered, or that
leaves out a topic the driver wrote, would release records before a worker has read them."""

from __future__ import annotations

import itertools

from schemas.control import DeliveredOffsets


def test_only_delivered_records_of_the_named_topics_count_and_offsets_never_go_back() -> None:
    delivered = DeliveredOffsets({"p.k8s.pods.v1"})
    delivered("p.k8s.pods.v1", 0, 7, True)
    delivered("p.k8s.pods.v1", 0, 5, True)  # a report that arrives late
    delivered("p.k8s.pods.v1", 1, 9, False)  # not delivered
    delivered("p.gpu.samples.v1", 0, 3, True)  # not a topic it covers
    assert delivered.snapshot() == {"p.k8s.pods.v1:0": 7}


def test_without_a_topic_list_every_topic_but_the_excluded_counts() -> None:
    delivered = DeliveredOffsets(None, exclude=frozenset({"p.internal.control.v1"}))
    delivered("p.gpu.samples.v1", 2, 11, True)
    delivered("p.k8s.events.v1", 0, 4, True)
    delivered("p.internal.control.v1", 0, 40, True)  # the marks themselves
    assert delivered.snapshot() == {"p.gpu.samples.v1:2": 11, "p.k8s.events.v1:0": 4}


def test_mark_numbers_grow_strictly_also_across_a_restart() -> None:
    first = DeliveredOffsets(None)
    numbers = [first.next_seq() for _ in range(1000)]
    assert all(b > a for a, b in itertools.pairwise(numbers))
    assert DeliveredOffsets(None).next_seq() > numbers[0]  # wall-clock based: a restarted driver starts above
