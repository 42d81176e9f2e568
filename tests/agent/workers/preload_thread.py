"""A module that must not be preloaded: it starts a thread on import."""

import threading

_stop = threading.Event()
threading.Thread(target=_stop.wait, name="metrics-flusher", daemon=True).start()
