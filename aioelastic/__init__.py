"""aioelastic: asyncio-native coordination for elastic distributed jobs.

The parts are independent subpackages, imported on demand so a worker that only needs the
watchdog client does not pay for the rest: ``aioelastic.timer``, ``aioelastic.store``,
``aioelastic.rendezvous``, ``aioelastic.agent`` and ``aioelastic.testing``.
"""

__version__ = "0.1.0.dev0"
__all__ = ["__version__"]
