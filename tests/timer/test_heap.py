"""The pure deadline heap: ordering, re-arming, release by key and by pid, compaction."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aioelastic.timer import DeadlineHeap, Timer


def timer(pid: int, scope: str, deadline: float, signal: int = 9) -> Timer:
    return Timer(pid, scope, deadline, deadline + 1000.0, signal)


def test_empty_heap_has_no_deadline() -> None:
    """An empty heap reports no next deadline and nothing due."""
    heap = DeadlineHeap()
    assert heap.next_deadline() is None
    assert list(heap.pop_due(1e9)) == []


def test_pop_due_returns_due_timers_earliest_first() -> None:
    """Only timers whose deadline passed come out, in deadline order."""
    heap = DeadlineHeap()
    for pid, deadline in [(1, 30.0), (2, 10.0), (3, 20.0), (4, 40.0)]:
        heap.arm(timer(pid, "s", deadline))
    assert [t.pid for t in heap.pop_due(30.0)] == [2, 3, 1]
    assert heap.next_deadline() == 40.0
    assert len(heap) == 1


def test_rearm_replaces_the_deadline() -> None:
    """Arming the same (pid, scope) again moves its deadline; the old one never fires."""
    heap = DeadlineHeap()
    heap.arm(timer(7, "step", 10.0))
    heap.arm(timer(7, "step", 50.0))
    assert list(heap.pop_due(20.0)) == []
    assert heap.next_deadline() == 50.0
    assert len(heap) == 1


def test_release_unknown_key_is_a_no_op() -> None:
    """Releasing a scope nobody armed returns None and changes nothing."""
    heap = DeadlineHeap()
    heap.arm(timer(7, "a", 10.0))
    assert heap.release((7, "b")) is None
    assert heap.release((8, "a")) is None
    assert len(heap) == 1


def test_release_pid_drops_only_that_process() -> None:
    """Dropping a pid removes all its scopes and leaves other processes' timers alone."""
    heap = DeadlineHeap()
    heap.arm(timer(7, "a", 3.0))
    heap.arm(timer(7, "b", 1.0))
    heap.arm(timer(8, "a", 2.0))
    assert [t.scope_id for t in heap.release_pid(7)] == ["b", "a"]
    assert heap.scopes(7) == frozenset()
    assert [t.key for t in heap.pop_due(10.0)] == [(8, "a")]


def test_pop_due_skips_timers_released_while_iterating() -> None:
    """A timer released while an earlier due timer is handled is not yielded."""
    heap = DeadlineHeap()
    heap.arm(timer(7, "a", 1.0))
    heap.arm(timer(7, "b", 2.0))
    seen = []
    for t in heap.pop_due(10.0):
        seen.append(t.key)
        heap.release_pid(t.pid)
    assert seen == [(7, "a")]


def test_churn_keeps_memory_bounded() -> None:
    """Re-arming one timer many times does not grow the heap without bound."""
    heap = DeadlineHeap()
    for i in range(10_000):
        heap.arm(timer(7, "step", float(i)))
    assert len(heap._heap) <= 2 * len(heap) + DeadlineHeap._COMPACT_SLACK + 1


keys = st.tuples(st.integers(2, 4), st.sampled_from(["a", "b", "c"]))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("arm"), keys, st.floats(0, 100)),
        st.tuples(st.just("release"), keys, st.just(0.0)),
        st.tuples(st.just("release_pid"), keys, st.just(0.0)),
        st.tuples(st.just("pop_due"), keys, st.floats(0, 100)),
    ),
    max_size=60,
)


@given(ops)
def test_heap_matches_a_sorted_model(operations: list[tuple[str, tuple[int, str], float]]) -> None:
    """Any sequence of operations gives what a naive sorted dictionary would."""
    heap = DeadlineHeap()
    model: dict[tuple[int, str], tuple[float, int]] = {}
    seq = 0
    for op, key, value in operations:
        if op == "arm":
            heap.arm(timer(key[0], key[1], value))
            model[key] = (value, seq)
            seq += 1
        elif op == "release":
            got = heap.release(key)
            expected = model.pop(key, None)
            assert (got.deadline if got else None) == (expected[0] if expected else None)
        elif op == "release_pid":
            got_keys = {t.key for t in heap.release_pid(key[0])}
            assert got_keys == {k for k in model if k[0] == key[0]}
            model = {k: v for k, v in model.items() if k[0] != key[0]}
        else:
            due = sorted((v, k) for k, v in model.items() if v[0] <= value)
            assert [t.key for t in heap.pop_due(value)] == [k for _, k in due]
            for _, k in due:
                del model[k]
        assert len(heap) == len(model)
        expected_next = min((v[0] for v in model.values()), default=None)
        assert heap.next_deadline() == expected_next
