"""Keys grouped by ``/``-separated directories, so prefix reads cost the answer, not the store.

Theory of operation. A key ``a/b/c`` lives in directory ``a/b/``, which lives in ``a/``, which
lives in the root ``""``. Each directory knows its keys, its subdirectories, and the highest
revision at which anything beneath it changed (a write, a delete, an expiry). So:

* the keys under a prefix ending in ``/`` (or the empty prefix) are one subtree walk;
* a prefix that ends mid-name (``round/1/res``) is its directory's entries that start with the
  rest of the name: a scan of one directory, never of the store;
* "did anything under this prefix change after revision r" is one number for a directory
  prefix, and a scan of one directory otherwise;
* a change is recorded in the key's directory and each ancestor: O(depth).

The index holds the keys the store remembers a change for (live keys and tombstones); the
store forgets tombstones with :meth:`KeyIndex.discard`, which prunes directories left empty.
A flat key space (no ``/``) degrades to one directory, which is the plain scan of before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class Directory:
    """One directory: its keys and subdirectories (dicts keep insertion order), and the
    latest revision of a change beneath it."""

    __slots__ = ("keys", "parent", "path", "revision", "subdirs")

    def __init__(self, path: str, parent: Directory | None) -> None:
        self.path = path
        self.parent = parent
        self.keys: dict[str, None] = {}
        self.subdirs: dict[str, Directory] = {}
        self.revision = 0


def split(prefix: str) -> tuple[str, str]:
    """``prefix`` as (its directory, the rest of the name): ``a/b/c`` -> (``a/b/``, ``c``)."""
    cut = prefix.rfind("/") + 1
    return prefix[:cut], prefix[cut:]


class KeyIndex:
    """The directory tree of a set of keys, with the latest change revision per directory."""

    __slots__ = ("_dirs", "_home", "examined")

    def __init__(self) -> None:
        self._dirs: dict[str, Directory] = {"": Directory("", None)}
        self._home: dict[str, Directory] = {}  # key -> the directory it is in
        self.examined = 0
        """Directory entries looked at to answer reads so far (what a read costs)."""

    def __len__(self) -> int:
        return len(self._home)

    def __contains__(self, key: object) -> bool:
        return key in self._home

    def _directory(self, path: str) -> Directory:
        """The directory ``path`` (ending in ``/``, or ``""``), created with its ancestors."""
        found = self._dirs.get(path)
        if found is not None:
            return found
        parent = self._directory(split(path[:-1])[0])
        made = Directory(path, parent)
        parent.subdirs[path] = made
        self._dirs[path] = made
        return made

    def changed(self, key: str, revision: int) -> Directory:
        """Record that ``key`` changed at ``revision``; return its directory (the first of the
        chain of directories, through ``parent``, that contain it)."""
        home = self._home.get(key)
        if home is None:
            home = self._directory(split(key)[0])
            home.keys[key] = None
            self._home[key] = home
        directory: Directory | None = home
        while directory is not None:
            directory.revision = revision
            directory = directory.parent
        return home

    def discard(self, key: str) -> None:
        """Forget ``key``; remove the directories that become empty."""
        home = self._home.pop(key, None)
        if home is None:
            return
        del home.keys[key]
        directory = home
        while directory.parent is not None and not directory.keys and not directory.subdirs:
            del directory.parent.subdirs[directory.path]
            del self._dirs[directory.path]
            directory = directory.parent

    def keys_under(self, prefix: str) -> Iterator[str]:
        """Every key starting with ``prefix``."""
        path, rest = split(prefix)
        directory = self._dirs.get(path)
        if directory is None:
            return
        if not rest:
            yield from self._walk(directory)
            return
        self.examined += len(directory.keys) + len(directory.subdirs)
        for key in directory.keys:
            if key.startswith(prefix):
                yield key
        for sub_path, sub in directory.subdirs.items():
            if sub_path.startswith(prefix):
                yield from self._walk(sub)

    def revision_under(self, prefix: str, revisions: Mapping[str, int]) -> int:
        """The latest revision at which a key starting with ``prefix`` changed (0 if none);
        ``revisions`` holds each key's own latest change."""
        path, rest = split(prefix)
        directory = self._dirs.get(path)
        if directory is None:
            return 0
        if not rest:
            return directory.revision
        self.examined += len(directory.keys) + len(directory.subdirs)
        latest = 0
        for key in directory.keys:
            if key.startswith(prefix):
                latest = max(latest, revisions[key])
        for sub_path, sub in directory.subdirs.items():
            if sub_path.startswith(prefix):
                latest = max(latest, sub.revision)
        return latest

    def _walk(self, directory: Directory) -> Iterator[str]:
        stack = [directory]
        while stack:
            current = stack.pop()
            self.examined += len(current.keys) + len(current.subdirs)
            yield from current.keys
            stack.extend(current.subdirs.values())
