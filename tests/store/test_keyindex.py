"""The MemoryStore's directory index answers prefix questions exactly as a scan of every key."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from aioelastic.store._keyindex import KeyIndex

_names = st.sampled_from(["a", "ab", "b", "", "n1", "n10"])
_keys = st.lists(_names, min_size=1, max_size=4).map("/".join)
_prefixes = st.one_of(
    _keys,
    _keys.map(lambda key: key + "/"),
    _keys.map(lambda key: key[:-1]),
    st.just(""),
)


class KeyIndexModel(RuleBasedStateMachine):
    """Keys, their latest change and forgotten keys, against a plain dict."""

    def __init__(self) -> None:
        super().__init__()
        self.index = KeyIndex()
        self.revisions: dict[str, int] = {}
        self.forgotten_max = 0  # the latest change of a key since forgotten
        self.revision = 0

    @rule(key=_keys)
    def change(self, key: str) -> None:
        self.revision += 1
        self.index.changed(key, self.revision)
        self.revisions[key] = self.revision

    @rule(key=_keys)
    def discard(self, key: str) -> None:
        self.index.discard(key)
        self.revisions.pop(key, None)

    @rule(prefix=_prefixes)
    def keys_under_match_a_scan(self, prefix: str) -> None:
        expected = sorted(key for key in self.revisions if key.startswith(prefix))
        assert sorted(self.index.keys_under(prefix)) == expected

    @rule(prefix=_prefixes)
    def revision_under_is_at_least_the_latest_change(self, prefix: str) -> None:
        latest = max((r for k, r in self.revisions.items() if k.startswith(prefix)), default=0)
        found = self.index.revision_under(prefix, self.revisions)
        # A directory remembers changes of keys forgotten since (the store compacts then).
        assert latest <= found <= self.revision

    @rule(prefix=_prefixes)
    def revision_under_is_exact_without_forgotten_keys(self, prefix: str) -> None:
        fresh = KeyIndex()
        for key, revision in sorted(self.revisions.items(), key=lambda item: item[1]):
            fresh.changed(key, revision)
        latest = max((r for k, r in self.revisions.items() if k.startswith(prefix)), default=0)
        assert fresh.revision_under(prefix, self.revisions) == latest

    @invariant()
    def size_matches(self) -> None:
        assert len(self.index) == len(self.revisions)
        assert all(key in self.index for key in self.revisions)


TestKeyIndexModel = KeyIndexModel.TestCase


def test_empty_directories_are_removed() -> None:
    """Forgetting the last key of a directory removes it and its empty ancestors."""
    index = KeyIndex()
    index.changed("a/b/c", 1)
    index.changed("a/d", 2)
    index.discard("a/b/c")
    assert list(index.keys_under("a/")) == ["a/d"]
    assert index.revision_under("a/b/", {}) == 0
    assert list(index.keys_under("a/b")) == []


def test_a_name_prefix_scans_one_directory() -> None:
    """``round/1/res`` finds ``round/1/result`` and ``round/1/rest/x``, not ``round/10/...``."""
    index = KeyIndex()
    for revision, key in enumerate(["round/1/result", "round/1/rest/x", "round/10/result"], 1):
        index.changed(key, revision)
    assert sorted(index.keys_under("round/1/res")) == ["round/1/rest/x", "round/1/result"]
    revisions = {"round/1/result": 1, "round/1/rest/x": 2, "round/10/result": 3}
    assert index.revision_under("round/1/res", revisions) == 2
    assert index.revision_under("round/1", revisions) == 3
