"""The ``aioelastic`` command's own layer: ``run``, ``status``, ``timeline`` and ``report``.

``aioelastic run`` (``cli_run.py``: torchrun's flags; ``launch.py``: from flags to a running
:class:`~aioelastic.agent.ElasticAgent`, its watchdog, event stream, metrics and exit status)
sits on top of every part: it imports the agent, the rendezvous, the stores, the event stream
and the metrics, and nothing below imports it. ``observe.py`` wires a job's components to the
event subscribers and ``progress.py`` reports a long rendezvous (``aioelastic.events``
re-exports both lazily); ``cpus.py`` and ``torch_logs.py`` serve only the launch. The other
subcommands read what a job left behind (its store, its event logs). ``aioelastic.cli``
dispatches to the ``cli_*`` modules; there is no Python API here.
"""
