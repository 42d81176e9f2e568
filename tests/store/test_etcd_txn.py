"""The exactly-once read-modify-write of the etcd store, as plain calls: no etcd, no event loop.

:class:`ModelEtcd` is a few lines of etcd's transaction semantics (compare, branches, leases,
one revision per write); the tests drive :class:`Update` against it the way the store's shell
does, and hypothesis plays the network: replies lost before or after the write landed, copies
that land late, other clients' writes in between, the session lease expiring.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioelastic.store._etcd_txn import (
    Change,
    CheckLease,
    Done,
    Get,
    GetResult,
    Guess,
    KeyValue,
    ModRevisionIs,
    Put,
    PutResult,
    ReadKey,
    ReadMarker,
    Restart,
    Send,
    Step,
    Txn,
    TxnResult,
    Unknown,
    Update,
    ValueIs,
    chain,
    range_end,
)

KEY = b"kv/n"
MARKER = b"ops/5/0"
SESSION = 5
KEY_LEASE = 9


class LeaseNotFound(Exception):
    """etcd refused a transaction whose chosen path puts with a lease that does not exist."""


@dataclass
class ModelEtcd:
    """etcd's transactions and leases, as far as the protocol relies on them."""

    kvs: dict[bytes, KeyValue] = field(default_factory=dict)
    revision: int = 1
    leases: set[int] = field(default_factory=lambda: {SESSION, KEY_LEASE})
    applied: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    """(key before, key after) of each transaction that wrote the key and the marker (an applied
    update; a fence writes the marker alone)."""

    def holds(self, compare: ModRevisionIs | ValueIs) -> bool:
        kv = self.kvs.get(compare.key)
        if isinstance(compare, ModRevisionIs):
            return (kv.mod_revision if kv is not None else 0) == compare.revision
        return kv is not None and kv.value == compare.value

    def _path(self, txn: Txn) -> list[Put]:
        puts: list[Put] = []
        for op in txn.success if all(map(self.holds, txn.compare)) else txn.failure:
            if isinstance(op, Txn):
                puts += self._path(op)
            elif isinstance(op, Put):
                puts.append(op)
        return puts

    def txn(self, txn: Txn) -> TxnResult:
        puts = self._path(txn)
        if any(put.lease and put.lease not in self.leases for put in puts):
            raise LeaseNotFound
        before = self.kvs.get(KEY)
        revision = self.revision + 1 if puts else self.revision
        result = self._run(txn, revision)
        self.revision = revision
        if {MARKER, KEY} <= {put.key for put in puts}:
            self.applied.append((before.value if before else None, self.kvs[KEY].value))
        return result

    def _run(self, txn: Txn, revision: int) -> TxnResult:
        succeeded = all(map(self.holds, txn.compare))
        results: list[PutResult | GetResult | TxnResult] = []
        for op in txn.success if succeeded else txn.failure:
            if isinstance(op, Txn):
                results.append(self._run(op, revision))
            elif isinstance(op, Get):
                results.append(GetResult(self.kvs.get(op.key)))
            else:
                old = self.kvs.get(op.key)
                if op.keep_lease:
                    assert old is not None, "etcd refuses ignore_lease on a missing key"
                lease = old.lease if op.keep_lease and old is not None else op.lease
                self.kvs[op.key] = KeyValue(op.key, op.value, revision, lease)
                results.append(PutResult())
        return TxnResult(succeeded, tuple(results), revision)

    def write(self, key: bytes, value: bytes) -> None:
        """Another client's plain write (keeping the key's lease)."""
        self.revision += 1
        old = self.kvs.get(key)
        self.kvs[key] = KeyValue(key, value, self.revision, old.lease if old else 0)

    def expire(self, lease: int) -> None:
        """``lease`` expires: its keys are deleted."""
        self.leases.discard(lease)
        doomed = [key for key, kv in self.kvs.items() if kv.lease == lease]
        if doomed:
            self.revision += 1
        for key in doomed:
            del self.kvs[key]


def plus(amount: int) -> Change:
    """An add's change."""
    return lambda current: str(int(current or b"0") + amount).encode()


def swap(expected: bytes, desired: bytes) -> Change:
    """A compare_set's change."""
    return lambda current: desired if current == expected else None


def update_of(
    etcd: ModelEtcd, change: Change, known: KeyValue | Guess | None, guesses: int = 1
) -> Update:
    tokens = itertools.count(1)
    marker = etcd.kvs.get(MARKER)
    return Update(
        KEY,
        change,
        known,
        marker=MARKER,
        lease=SESSION,
        marker_revision=marker.mod_revision if marker is not None else 0,
        tokens=lambda: b"t%d" % next(tokens),
        guesses=guesses,
    )


def answer(etcd: ModelEtcd, update: Update, step: Step) -> Step:
    """The shell's answer to ``step`` when nothing goes wrong."""
    if isinstance(step, Send):
        return update.received(etcd.txn(step.txn))
    if isinstance(step, ReadKey):
        return update.key_read(etcd.kvs.get(step.key))
    if isinstance(step, ReadMarker):
        return update.marker_read(etcd.kvs.get(step.key))
    assert isinstance(step, CheckLease), step
    return update.lease_checked(step.lease in etcd.leases)


def run(etcd: ModelEtcd, update: Update) -> Step:
    step = update.start()
    for _ in range(20):
        if isinstance(step, Done | Restart | Unknown):
            return step
        step = answer(etcd, update, step)
    raise AssertionError(f"no outcome after 20 steps: {step}")


# -- plain examples ------------------------------------------------------------------------------


def test_the_first_attempt_requires_the_marker_and_the_key_as_read() -> None:
    """A key as read is written only if its mod revision is unchanged, keeping its lease, and
    only if the marker is as last known; the marker gets this attempt's token."""
    kv = KeyValue(KEY, b"5", 7, KEY_LEASE)
    step = update_of(ModelEtcd(), plus(1), kv).start()
    assert step == Send(
        Txn(
            (ModRevisionIs(MARKER, 0),),
            (
                Txn(
                    (ModRevisionIs(KEY, 7),),
                    (Put(KEY, b"6", lease=KEY_LEASE), Put(MARKER, b"t1", SESSION)),
                    (Get(KEY),),
                ),
            ),
            (Get(KEY), Get(MARKER)),
        )
    )


def test_a_guess_compares_the_value_and_keeps_the_lease() -> None:
    """A blind update compares the guessed value, and writes keeping whatever lease it has."""
    step = update_of(ModelEtcd(), plus(1), Guess(b"5")).start()
    assert isinstance(step, Send)
    (branch,) = step.txn.success
    assert isinstance(branch, Txn)
    assert branch.compare == (ValueIs(KEY, b"5"),)
    assert branch.success[0] == Put(KEY, b"6", keep_lease=True)


def test_a_declined_change_is_done_without_a_request() -> None:
    """compare_set on a value it does not expect writes nothing and reports the value."""
    step = update_of(ModelEtcd(), swap(b"1", b"2"), KeyValue(KEY, b"5", 3)).start()
    assert step == Done(None, b"5")


def test_a_stale_read_lands_in_one_transaction_through_the_fallbacks() -> None:
    """Adds by other clients between an add's read and its write do not cost a retry: a
    fallback matches the value they left, and the sum is still exact."""
    etcd = ModelEtcd()
    etcd.write(KEY, b"5")
    stale = etcd.kvs[KEY]
    etcd.write(KEY, b"6")
    etcd.write(KEY, b"7")
    update = update_of(etcd, plus(1), stale, guesses=4)
    assert run(etcd, update) == Done(b"8", b"8")
    assert (update.attempts, etcd.applied) == (1, [(b"7", b"8")])


def test_a_value_outside_the_fallbacks_is_read_back_and_retried() -> None:
    """A key that surprises every branch is read back in the same transaction; the retry from
    that value applies."""
    etcd = ModelEtcd()
    etcd.write(KEY, b"1000")
    update = update_of(etcd, plus(1), Guess(None), guesses=4)
    assert run(etcd, update) == Done(b"1001", b"1001")
    assert update.attempts == 2


def test_a_marker_moved_by_a_write_never_seen_costs_one_round_then_applies_once() -> None:
    """A slot whose marker was moved behind the store's back (a late write of an earlier call)
    does not wedge the update: it compares with the marker as it is now, and applies once."""
    etcd = ModelEtcd()
    etcd.write(KEY, b"1")
    update = update_of(etcd, plus(1), etcd.kvs[KEY])
    etcd.write(MARKER, b"landed-unseen")
    assert run(etcd, update) == Done(b"2", b"2")
    assert update.attempts == 2
    assert update.marker_revision == etcd.kvs[MARKER].mod_revision
    assert etcd.applied == [(b"1", b"2")]


def test_a_lost_reply_that_landed_is_found_by_its_marker() -> None:
    """After a lost reply, the marker holding that attempt's token means it was applied."""
    etcd = ModelEtcd()
    update = update_of(etcd, plus(1), None)
    send = update.start()
    assert isinstance(send, Send)
    etcd.txn(send.txn)  # it landed; its reply did not come back
    assert update.reply_lost() == ReadMarker(MARKER)
    assert update.marker_read(etcd.kvs[MARKER]) == Done(b"1", b"1")
    assert update.marker_revision == etcd.kvs[MARKER].mod_revision


def test_no_marker_after_a_lost_reply_is_conclusive_only_while_the_lease_lives() -> None:
    """A missing marker means "not applied" if the session lease lives, "unknown" if not."""
    update = update_of(ModelEtcd(), plus(1), None)
    update.start()
    assert update.reply_lost() == ReadMarker(MARKER)
    assert update.marker_read(None) == CheckLease(SESSION)
    assert update.lease_checked(True) == ReadKey(KEY)
    assert update.lease_checked(False) == Unknown()


def test_a_marker_that_vanished_after_a_lost_reply_is_unknown() -> None:
    """A marker known to exist and gone after a lost reply went with the lease: unknown."""
    etcd = ModelEtcd()
    etcd.write(MARKER, b"old")
    update = update_of(etcd, plus(1), None)
    update.start()
    update.reply_lost()
    assert update.marker_read(None) == Unknown()


@pytest.mark.parametrize(("in_doubt", "expected"), [(False, Restart()), (True, Unknown())])
def test_a_missing_session_lease_restarts_only_when_nothing_may_have_landed(
    in_doubt: bool, expected: Step
) -> None:
    """A refused lease that is the session's means starting over on a new session, unless a
    lost attempt may have landed before the lease (and its marker) went."""
    update = update_of(ModelEtcd(), plus(1), None)
    update.start()
    if in_doubt:
        update.reply_lost()
    assert update.lease_missing(session_alive=True) == ReadKey(KEY)
    assert update.lease_missing(session_alive=False) == expected


def test_a_copy_that_landed_late_before_the_lease_went_is_never_applied_again() -> None:
    """An attempt lost in flight, then found not landed (no marker, lease alive), may land
    later; if the session lease then expires (taking its marker), the update does not start
    over on a new session (that could apply it twice): the outcome is unknown."""
    etcd = ModelEtcd()
    update = update_of(etcd, plus(1), None)
    first = update.start()
    assert isinstance(first, Send)
    check = answer(etcd, update, update.reply_lost())  # no marker: is the lease alive?
    assert answer(etcd, update, check) == ReadKey(KEY)  # yes: not landed (yet)
    etcd.txn(first.txn)  # the lost copy lands now
    etcd.expire(SESSION)
    retry = update.key_read(etcd.kvs.get(KEY))
    assert isinstance(retry, Send)
    with pytest.raises(LeaseNotFound):
        etcd.txn(retry.txn)
    assert update.lease_missing(session_alive=False) == Unknown()
    assert etcd.applied == [(None, b"1")]


def test_a_marker_gone_with_the_lease_while_a_copy_was_in_flight_is_unknown() -> None:
    """A lost attempt found not landed (the marker still an earlier call's) may land later; a
    marker then missing (the lease took it) may have held that attempt's token: unknown."""
    etcd = ModelEtcd()
    etcd.write(MARKER, b"an earlier call's token")
    etcd.kvs[MARKER] = KeyValue(MARKER, b"an earlier call's token", etcd.revision, SESSION)
    update = update_of(etcd, plus(1), None)
    first = update.start()
    assert isinstance(first, Send)
    assert answer(etcd, update, update.reply_lost()) == ReadKey(KEY)
    etcd.txn(first.txn)  # the lost copy lands now
    etcd.expire(SESSION)
    retry = update.key_read(etcd.kvs.get(KEY))
    assert isinstance(retry, Send)
    assert update.received(etcd.txn(retry.txn)) == Unknown()
    assert etcd.applied == [(None, b"1")]


def test_a_copy_landing_between_the_marker_and_the_key_read_is_found_by_the_fence() -> None:
    """A compare_set lost in flight, found not landed by its marker, lands before the key is
    read: the key then holds the desired value, so the change declines. Stopping there would
    say "not applied" of an applied update (hypothesis found this); the update fences instead,
    and the fence's failure shows the attempt's token: applied, once."""
    etcd = ModelEtcd()
    etcd.write(KEY, b"5")
    update = update_of(etcd, swap(b"5", b"6"), etcd.kvs[KEY])
    first = update.start()
    assert isinstance(first, Send)
    assert answer(etcd, update, answer(etcd, update, update.reply_lost())) == ReadKey(KEY)
    etcd.txn(first.txn)  # the lost copy lands now
    fence = update.key_read(etcd.kvs.get(KEY))
    assert isinstance(fence, Send)  # not Done(None, b"6")
    assert update.received(etcd.txn(fence.txn)) == Done(b"6", b"6")
    assert etcd.applied == [(b"5", b"6")]


def test_a_fence_keeps_a_lost_copy_from_landing_after_a_declined_change() -> None:
    """Once the fence moved the marker, a copy of the lost attempt still in flight cannot land:
    "not applied" stays true. A fence whose own reply is lost is found by its token."""
    etcd = ModelEtcd()
    etcd.write(KEY, b"9")
    update = update_of(etcd, swap(b"9", b"6"), etcd.kvs[KEY])
    first = update.start()
    assert isinstance(first, Send)
    assert answer(etcd, update, answer(etcd, update, update.reply_lost())) == ReadKey(KEY)
    etcd.write(KEY, b"7")  # another client: the change now declines
    fence = update.key_read(etcd.kvs.get(KEY))
    assert isinstance(fence, Send)
    etcd.txn(fence.txn)  # the fence lands; its reply is lost
    assert update.reply_lost() == ReadMarker(MARKER)
    assert update.marker_read(etcd.kvs[MARKER]) == ReadKey(KEY)
    assert update.key_read(etcd.kvs.get(KEY)) == Done(None, b"7")
    etcd.txn(first.txn)  # the copy still in flight lands now: refused by the marker
    assert etcd.applied == []
    assert etcd.kvs[KEY].value == b"7"


def test_chain_applies_the_change_until_it_declines() -> None:
    """The fallback values are the change applied again, up to the length or a refusal."""
    assert chain(plus(2), b"1", 3) == [b"3", b"5", b"7"]
    assert chain(swap(b"1", b"2"), b"1", 3) == [b"2"]
    assert chain(swap(b"1", b"2"), b"0", 3) == []


@pytest.mark.parametrize(
    ("prefix", "end"), [(b"a/", b"a0"), (b"a\xff", b"b"), (b"\xff\xff", b"\0"), (b"", b"\0")]
)
def test_range_end_covers_every_key_with_the_prefix(prefix: bytes, end: bytes) -> None:
    """etcd's range end for a prefix: the prefix with its last byte below 0xff raised."""
    assert range_end(prefix) == end


# -- the network as an adversary -----------------------------------------------------------------


ACTIONS = ["nothing", "nothing", "add", "set", "late", "late", "expire session", "expire key"]
"""What the network and the other clients may do between two steps (twice)."""


@dataclass
class Adversary:
    """Draws what the network and the other clients do at each step."""

    draw: Callable[[st.SearchStrategy[object]], object]
    etcd: ModelEtcd
    late: list[Txn] = field(default_factory=list)  # lost before landing: may land any time later
    budget: int = 6  # interferences left (so that the update can finish)

    def interfere(self) -> None:
        for _ in range(2):
            if not self.budget:
                return
            what = self.draw(st.sampled_from(ACTIONS))
            self.budget -= what != "nothing"
            if what == "add":
                current = self.etcd.kvs.get(KEY)
                self.etcd.write(KEY, plus(1)(current.value if current else None))
            elif what == "set":
                self.etcd.write(KEY, b"9")
            elif what == "late" and self.late:
                self.land(self.late.pop(0))
            elif what == "expire session":
                self.etcd.expire(SESSION)
            elif what == "expire key":
                self.etcd.expire(KEY_LEASE)

    def land(self, txn: Txn) -> None:
        with contextlib.suppress(LeaseNotFound):
            self.etcd.txn(txn)


@settings(max_examples=500)
@given(data=st.data())
def test_an_update_applies_exactly_once_whatever_the_network_does(data: st.DataObject) -> None:
    """Whatever replies are lost, whatever lands late, whatever other clients write and
    whichever lease expires: the update applies at most once, ``Done`` means exactly once (with
    the change of the value it replaced), ``Restart`` means not at all, and ``Unknown`` is only
    said once the session lease is gone."""
    etcd = ModelEtcd()
    initial = data.draw(st.sampled_from([None, b"5", b"9"]))
    if initial is not None:
        etcd.write(KEY, initial)
        if data.draw(st.booleans()):
            etcd.kvs[KEY] = KeyValue(KEY, initial, etcd.revision, KEY_LEASE)
    if data.draw(st.booleans()):
        etcd.write(MARKER, b"an earlier call's token")
    kind = data.draw(st.sampled_from(["add", "compare_set"]))
    change = plus(1) if kind == "add" else swap(b"5", b"6")
    read = etcd.kvs.get(KEY)
    known = data.draw(st.sampled_from([read, Guess(read.value if read else None), Guess(b"9")]))
    update = update_of(etcd, change, known, guesses=data.draw(st.sampled_from([1, 4])))
    adversary = Adversary(data.draw, etcd)
    adversary.interfere()
    step = update.start()
    for _ in range(60):
        if isinstance(step, Done | Restart | Unknown):
            break
        adversary.interfere()
        if isinstance(step, Send):
            fate = data.draw(st.sampled_from(["reply", "lost after", "lost before"]))
            if fate == "lost before":
                adversary.late.append(step.txn)
                step = update.reply_lost()
                continue
            try:
                result = etcd.txn(step.txn)
            except LeaseNotFound:
                step = update.lease_missing(SESSION in etcd.leases)
                continue
            step = update.received(result) if fate == "reply" else update.reply_lost()
        else:
            step = answer(etcd, update, step)
    else:
        raise AssertionError(f"no outcome after 60 steps: {step}")
    for txn in adversary.late:  # every copy still in flight lands now
        adversary.land(txn)
    assert len(etcd.applied) <= 1
    if isinstance(step, Done) and step.written is not None:
        ((before, after),) = etcd.applied
        assert after == step.written == change(before)
    elif isinstance(step, Unknown):
        assert SESSION not in etcd.leases
    else:
        assert etcd.applied == []
