"""The exactly-once read-modify-write of :class:`~aioelastic.store.EtcdStore`, without I/O.

Theory of operation. ``add``, ``append`` and ``compare_set`` are a conditional write from what
the key holds (``append`` reads it first; ``add`` starts from a guess, the value this store last
wrote, and ``compare_set`` from the expected value, each read back only on a miss, inside the
same transaction); the reply of the write can be lost (a member dies, a timeout), and
re-sending it blindly could apply it twice. So each call owns a *marker* key (a slot under the
store's session lease) and every transaction it sends:

* requires the marker to be at the mod revision the call last knew (0: missing), so once one
  attempt lands, no other attempt of the call (a re-send, or a late copy of a lost one) can;
* writes a token unique to that attempt to the marker, next to the new value of the key;
* carries fallbacks: if the key is not as read, branch ``i`` writes ``values[i]`` when the key
  holds ``values[i - 1]`` (``change`` applied again: what other clients' adds of the same amount
  leave), so contending adds land in one round instead of retrying one by one;
* reads the key back (and the marker, when the marker moved) when no branch applies.

Interpreting a reply has three outcomes: *applied* (a branch wrote), *landed earlier* (the marker
holds a token of an attempt whose reply was lost) or *retry* (from the value read back). After a
lost reply the marker says whether that attempt landed; a missing marker is conclusive only while
the session lease lives. When the lease (and with it the marker) is gone while an attempt may
still have landed, the outcome is unknown and is reported, never guessed. And a lost attempt may
land *after* the marker was read: a call that would stop on what it reads while one of its
attempts is in doubt (``compare_set`` finding another value) first *fences*: it moves the marker
to a token of its own in a transaction that requires the marker as last known, so no copy of an
earlier attempt can land after it, and reads the key in the same transaction.

:class:`Update` is that protocol as a state machine the shell drives: each method returns the
next :data:`Step` (send this, read that, done), as h11's connection returns events. Requests and
replies are plain data here (:class:`Txn`, :class:`TxnResult`); ``_etcd_rpc`` translates them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Change = Callable[[bytes | None], bytes | None]
"""``change(current)``: the value to write for ``current`` (None: missing), or None to stop."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """A key as etcd returned it."""

    key: bytes
    value: bytes
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Guess:
    """What a key is believed to hold (None: missing) when it was not read first."""

    value: bytes | None


Known = KeyValue | Guess | None
"""What an update starts from: a key as read, a guess, or a key known to be missing."""


@dataclass(frozen=True, slots=True)
class ModRevisionIs:
    """The key's mod revision is ``revision`` (0: the key is missing)."""

    key: bytes
    revision: int


@dataclass(frozen=True, slots=True)
class ValueIs:
    """The key exists and holds ``value``."""

    key: bytes
    value: bytes


Compare = ModRevisionIs | ValueIs


@dataclass(frozen=True, slots=True)
class Put:
    """Write ``value``, attached to ``lease`` (0: none), or keeping the key's lease."""

    key: bytes
    value: bytes
    lease: int = 0
    keep_lease: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    """Read one key."""

    key: bytes


@dataclass(frozen=True, slots=True)
class Txn:
    """If every comparison holds, run ``success``, else ``failure`` (ops run in order)."""

    compare: tuple[Compare, ...]
    success: tuple[Op, ...]
    failure: tuple[Op, ...] = ()


Op = Put | Get | Txn


@dataclass(frozen=True, slots=True)
class PutResult:
    """A put was done."""


@dataclass(frozen=True, slots=True)
class GetResult:
    """The key read (None: missing)."""

    kv: KeyValue | None


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Which branch ran, one result per op of that branch, and the store revision after it."""

    succeeded: bool
    results: tuple[OpResult, ...]
    revision: int


OpResult = PutResult | GetResult | TxnResult


# -- what the shell is asked to do next ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``txn`` once (never re-send it: report a lost reply with :meth:`Update.reply_lost`)."""

    txn: Txn


@dataclass(frozen=True, slots=True)
class ReadKey:
    """Read the key and pass it to :meth:`Update.key_read`."""

    key: bytes


@dataclass(frozen=True, slots=True)
class ReadMarker:
    """Read the marker and pass it to :meth:`Update.marker_read`."""

    key: bytes


@dataclass(frozen=True, slots=True)
class CheckLease:
    """Find out whether the session lease lives; pass it to :meth:`Update.lease_checked`."""

    lease: int


@dataclass(frozen=True, slots=True)
class Done:
    """Finished: ``written`` is the value this call wrote (None: ``change`` declined)."""

    written: bytes | None
    current: bytes | None


@dataclass(frozen=True, slots=True)
class Restart:
    """The session lease is gone and nothing of this call landed: start over on a new session."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """The marker is gone with the session lease while an attempt may have landed."""


Step = Send | ReadKey | ReadMarker | CheckLease | Done | Restart | Unknown


def chain(change: Change, current: bytes | None, length: int) -> list[bytes]:
    """``change(current)``, then ``change`` of that, ...: up to ``length`` values to write."""
    values: list[bytes] = []
    value = current
    while len(values) < length:
        next_value = change(value)
        if next_value is None:
            break
        values.append(next_value)
        value = next_value
    return values


def update_request(
    key: bytes,
    known: Known,
    values: Sequence[bytes],
    marker: bytes,
    lease: int,
    marker_revision: int,
    tokens: Sequence[bytes],
) -> Txn:
    """The transaction of one attempt (see the module docstring).

    If the marker is unchanged, branch 0 writes ``values[0]`` if the key is still as read (same
    mod revision, keeping its lease) or, for a :class:`Guess`, holds the guessed value (or is
    missing); otherwise branch ``i`` writes ``values[i]`` if the key now holds ``values[i - 1]``
    (keeping whatever lease it has); each branch also writes its own token to the marker. When
    no branch applies, the key is read back; when the marker moved, the key and the marker.
    """
    otherwise: tuple[Op, ...] = (Get(key),)
    for i in reversed(range(len(values))):
        compare: Compare
        if i == 0 and isinstance(known, Guess) and known.value is not None:
            compare, write = ValueIs(key, known.value), Put(key, values[0], keep_lease=True)
        elif i == 0:
            read = known if isinstance(known, KeyValue) else None
            compare = ModRevisionIs(key, read.mod_revision if read is not None else 0)
            write = Put(key, values[0], lease=read.lease if read is not None else 0)
        else:
            compare, write = ValueIs(key, values[i - 1]), Put(key, values[i], keep_lease=True)
        branch = Txn((compare,), (write, Put(marker, tokens[i], lease)), otherwise)
        otherwise = (branch,)
    return Txn((ModRevisionIs(marker, marker_revision),), otherwise, (Get(key), Get(marker)))


def fence_request(key: bytes, marker: bytes, lease: int, marker_revision: int, token: bytes) -> Txn:
    """Move the marker to ``token`` if it is at ``marker_revision`` and read ``key``; else read
    the key and the marker (as :func:`update_request` does when the marker moved)."""
    return Txn(
        (ModRevisionIs(marker, marker_revision),),
        (Put(marker, token, lease), Get(key)),
        (Get(key), Get(marker)),
    )


@dataclass(slots=True)
class Update:
    """One exactly-once read-modify-write of ``key`` through the marker slot ``marker``.

    ``known`` is what the key is believed to hold; ``marker_revision`` the marker's mod revision
    as last known (the shell keeps it per slot: read it back from here once done); ``tokens()``
    returns a token never used before by this store. Start with :meth:`start`, then feed each
    step's answer to the method the step names.
    """

    key: bytes
    change: Change
    known: Known
    marker: bytes
    lease: int
    marker_revision: int
    tokens: Callable[[], bytes]
    guesses: int = 1
    attempts: int = 0
    _values: list[bytes] = field(default_factory=list)
    _written: dict[bytes, bytes] = field(default_factory=dict)  # token -> the value it writes
    _in_doubt: bool = False  # an attempt whose reply was lost may still land
    _fences: set[bytes] = field(default_factory=set)  # tokens that moved the marker, no value
    _fencing: bool = False  # the last Send is a fence

    def start(self) -> Step:
        """The first step: send the first attempt (or done, if ``change`` declines)."""
        return self._attempt()

    def received(self, result: TxnResult) -> Step:
        """The reply to the last :class:`Send`."""
        if result.succeeded and self._fencing:  # no earlier attempt can land any more
            key_read = result.results[1]
            assert isinstance(key_read, GetResult), result
            return self._fenced(result.revision, key_read.kv)
        if result.succeeded:  # the marker was as expected: walk down the branches
            branch = result.results[0]
            for value in self._values:
                assert isinstance(branch, TxnResult), branch
                if branch.succeeded:
                    self.marker_revision = result.revision
                    return Done(value, value)
                inner = branch.results[0]
                if isinstance(inner, GetResult):
                    self.known = inner.kv
                    break
                branch = inner
            return self._attempt()
        key_read, marker_read = result.results
        assert isinstance(key_read, GetResult), result
        assert isinstance(marker_read, GetResult), result
        found = marker_read.kv
        if found is not None and found.value in self._written:
            return self._landed(found)  # an attempt whose reply was lost has landed since
        if found is not None and found.value in self._fences:
            return self._fenced(found.mod_revision, key_read.kv)  # a lost fence landed since
        if found is None and self.marker_revision != 0 and self._in_doubt:
            return Unknown()  # the lease took the marker, and maybe a landed attempt's token
        # Not our marker, and every attempt of this call is known not to have applied (each
        # required the marker as it was): what changed it is history. Compare with the marker as
        # it is now; comparing with the revision it had would fail forever.
        self.marker_revision = found.mod_revision if found is not None else 0
        self._in_doubt = False
        self.known = key_read.kv
        return self._attempt()

    def reply_lost(self) -> Step:
        """The last :class:`Send` failed without a reply: it may or may not have landed."""
        self._in_doubt = True
        return ReadMarker(self.marker)

    def marker_read(self, found: KeyValue | None) -> Step:
        """The marker as read after a lost reply."""
        if found is not None:
            if found.value in self._written:
                return self._landed(found)
            if found.value in self._fences:  # a lost fence landed: read the key after it
                self.marker_revision, self._in_doubt = found.mod_revision, False
            return ReadKey(self.key)  # not (yet) landed; a late copy still needs the marker
        if self.marker_revision == 0:
            return CheckLease(self.lease)  # no marker yet: conclusive only if the lease lives
        return Unknown()  # the marker existed: the lease took it

    def lease_checked(self, alive: bool) -> Step:
        """Whether the session lease lives (asked by :class:`CheckLease`)."""
        return ReadKey(self.key) if alive else Unknown()

    def key_read(self, kv: KeyValue | None) -> Step:
        """The key as read (asked by :class:`ReadKey`)."""
        self.known = kv
        return self._attempt()

    def lease_missing(self, session_alive: bool) -> Step:
        """etcd refused the last :class:`Send` for a missing lease (nothing of it applied).

        Either the key's own lease expired (the key went with it: read it again), or the session
        lease did, and with it the marker: start over, unless an attempt may have landed.
        """
        if session_alive:
            return ReadKey(self.key)
        return Unknown() if self._in_doubt else Restart()

    def _attempt(self) -> Step:
        current = self.known.value if self.known is not None else None
        self._values = chain(self.change, current, self.guesses)
        self._fencing = not self._values and self._in_doubt
        if self._fencing:  # stopping on a read is only sound once no lost attempt can land
            token = self.tokens()
            self._fences.add(token)
            return Send(
                fence_request(self.key, self.marker, self.lease, self.marker_revision, token)
            )
        if not self._values:
            return Done(None, current)
        tokens = [self.tokens() for _ in self._values]
        self._written.update(zip(tokens, self._values, strict=True))
        self.attempts += 1
        return Send(
            update_request(
                self.key,
                self.known,
                self._values,
                self.marker,
                self.lease,
                self.marker_revision,
                tokens,
            )
        )

    def _fenced(self, marker_revision: int, kv: KeyValue | None) -> Step:
        """The marker moved to a fence at ``marker_revision``: nothing in doubt any more."""
        self.marker_revision, self._in_doubt, self.known = marker_revision, False, kv
        return self._attempt()

    def _landed(self, found: KeyValue) -> Done:
        self.marker_revision = found.mod_revision
        value = self._written[found.value]
        return Done(value, value)


def range_end(prefix: bytes) -> bytes:
    """The end of etcd's key range holding every key that starts with ``prefix``."""
    data = bytearray(prefix)
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return bytes(data)
        data.pop()
    return b"\0"
