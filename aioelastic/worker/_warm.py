"""Warm spares: what a running worker has loaded, learned once and imported into idle spares.

A process that only ran ``import torch`` is not as warm as a worker that took a step: the first
``DistributedDataParallel(...)`` of a process imports ``torch._dynamo`` and its kin (about
1.5 s here), and in a collective its peers wait for those imports. Under
``--recovery in-place`` a worker therefore reports the names in its ``sys.modules`` once, over
its link to the agent, when they stopped growing over a step (:class:`Reporter`, driven by
``world.check()``); the agent keeps them (a plain list, see ``InPlaceGroup.warm_modules``) and
sends them to its idle spares, which import them while they wait for a rank
(:func:`import_modules`) and take one throwaway step (:func:`warm_up_torch`).

The agent also hands the names to its fork template (``agent/_template.py``), which must stay
single-threaded and so imports them its own way (``_template_main.learn_all``). A spare forks
nothing: it imports every name and says, in one line, which started threads.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aioelastic.worker._link import Link
from aioelastic.worker._protocol import Loaded, chunked

logger = logging.getLogger("aioelastic.worker")

NOT_LEARNED = ("__main__", "__mp_main__")
"""Names a worker never reports: its script, which a spare runs as its own."""


def loaded_modules() -> list[str]:
    """The names of the modules this process has loaded, in the order they were first
    imported (a parent before the modules it imports), less its script and failed imports."""
    return [
        name
        for name, module in list(sys.modules.items())
        if module is not None and name not in NOT_LEARNED
    ]


def thread_count() -> int:
    """This process's OS threads (``/proc/self/task``; Python's own count elsewhere): what a
    fork would copy one of, and what CPython 3.12+ warns about at a fork."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


@dataclass(slots=True)
class Imported:
    """What :func:`import_modules` did with each name."""

    imported: list[str] = field(default_factory=list)
    """Imported now."""
    present: int = 0
    """How many were loaded already."""
    failed: dict[str, str] = field(default_factory=dict)
    """Name -> the exception its import raised (it is left to the worker's own import)."""
    threaded: list[str] = field(default_factory=list)
    """Modules whose import started a thread, with every module first loaded by that import
    (any of them may be the one that started it)."""


def import_modules(names: Iterable[str], *, stop: Callable[[], bool] | None = None) -> Imported:
    """Import each of ``names`` not loaded yet, in order; one failing import skips that name.
    ``stop`` is asked between imports (a spare stops warming once it has a rank)."""
    pending = [name for name in dict.fromkeys(names) if name not in NOT_LEARNED]
    done = Imported()
    started: list[str] = []
    for name in pending:
        if name in sys.modules:
            done.present += 1
            continue
        if stop is not None and stop():
            break
        before, loaded = thread_count(), len(sys.modules)
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as exc:  # the worker's own import will say why
            done.failed[name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        done.imported.append(name)
        if thread_count() > before:
            brought = list(sys.modules)[loaded:]  # in import order: appended to the dict
            started.append(name)
            done.threaded += [n for n in dict.fromkeys([name, *brought]) if n not in done.threaded]
    if started:
        logger.info("warming: the import of %s started thread(s)", ", ".join(started[:20]))
    if done.failed:
        logger.debug("warming: %d import(s) failed: %s", len(done.failed), done.failed)
    return done


class Reporter:
    """Says once, on a link, which modules this worker has loaded: at the first step
    boundary at which ``sys.modules`` did not grow since the previous one (the first
    ``DistributedDataParallel``, backward and optimizer step are behind it)."""

    def __init__(self, send: Callable[[list[str]], None]) -> None:
        self._send = send
        self._seen = -1
        self.sent = False

    def at_step(self) -> None:
        """A step boundary (``world.check()``): report if the module set stopped growing."""
        if self.sent:
            return
        count = len(sys.modules)
        if count == self._seen:
            self.sent = True
            self._send(loaded_modules())
        self._seen = count


_REPORTER: Reporter | None = None


def at_step(link: Link) -> None:
    """A step boundary of a linked worker (``world.check()``): report its modules once."""
    global _REPORTER
    if _REPORTER is None:

        def send(names: list[str]) -> None:
            for message in chunked(Loaded, names):
                link.send(message)

        _REPORTER = Reporter(send)
    _REPORTER.at_step()


def while_idle(link: Link) -> bool:
    """Import what the agent sent this idle spare (it stops once the spare has a world);
    False if there was nothing to import."""
    if not link.warm:
        return False
    names, link.warm = link.warm, []

    def placed() -> bool:
        link.poll()
        return bool(link.assigned) or link.no_more is not None

    done = import_modules(names, stop=placed)
    if not placed():
        warm_up_torch()
    logger.info(
        "warming: imported %d module(s) while idle (%d loaded already, %d failed)",
        len(done.imported),
        done.present,
        len(done.failed),
    )
    return True


OPTIMIZER_NEEDS = "torch._dynamo"
"""What torch's first optimizer imports (about 800 modules, 1-1.6 s here): a spare takes the
throwaway optimizer step only once the workers' modules brought it in."""


def warm_up_torch() -> None:
    """One throwaway backward and optimizer step, if torch is loaded: the autograd engine,
    the optimizer's code path and the intra-op thread pool start here rather than in the
    spare's first step (about 1 ms of CPU on a 2-core machine). It draws no random number
    and leaves no state; never in a process that will fork (it runs tensor ops).

    It imports nothing the workers did not load: the optimizer step only where
    :data:`OPTIMIZER_NEEDS` is loaded already. Otherwise a spare would spend a second or more
    importing what no worker uses, deaf to its link: a world assigned meanwhile waits."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return
    try:
        weight = torch.ones(4, 4, requires_grad=True)
        (torch.ones(2, 4) @ weight).sum().backward()
        if OPTIMIZER_NEEDS in sys.modules:
            torch.optim.SGD([weight], lr=0.1).step()
        torch.ones(1 << 16).add_(1)  # above the intra-op grain size: the pool starts
    except Exception as exc:  # a broken or stubbed torch: warming is only worth trying
        logger.info("warming: the throwaway step failed (%s)", exc)
