"""A pure-Python module of the tests' own that a worker imports lazily: nothing of it shows in
the worker's maps, so only its recorded imports can teach the fork template to hold it."""

IMPORTED = True
