"""``worker.hand_over``: the job's state, from a survivor to the fresh ranks of a world.

A fresh rank (a spare or a replacement, ``world.fresh_ranks``) holds none of the job's state;
the survivors hold it in memory. :func:`hand_over` sends it from ``world.source_rank`` (the
lowest surviving rank) to every fresh rank over the world's process group (and to a survivor
left a step behind or ahead, see :func:`hand_over`), in place of the checkpoint a torchrun script
loads after a restart: the module's ``state_dict`` (received
straight into the fresh rank's own tensors), the optimizer's, a step counter, the RNG states
(torch, CUDA where initialised, ``random``, NumPy where imported) and any ``extra`` object
(tensors travel as tensors, the rest is pickled). Every rank of the world calls it with the
same kinds of arguments; without an agent (torchrun, where every rank holds its state) it
returns at once, without a collective, so the same script runs there.

How: the source sends a skeleton (the state with each tensor replaced by its shape and dtype)
with ``send_object_list``, then each tensor with ``isend``, all at once; a fresh rank posts
an ``irecv`` for each, into its own module's tensor where shape and dtype match.
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from aioelastic.worker._world import World


logger = logging.getLogger("aioelastic.worker")


class HandOverError(Exception):
    """The ranks of a world called :func:`hand_over` with arguments that do not fit together."""


@dataclass(frozen=True, slots=True)
class HandedOver:
    """What :func:`hand_over` returns on every rank: the job's step and ``extra`` (on a
    receiving rank the source's, elsewhere the rank's own), whether this rank received them,
    and whether a module was handed over in this world (the same on every rank): then every
    rank holds the source's module, and ``DistributedDataParallel(module,
    init_sync=not handed.synced)`` skips the copy of rank 0's module its constructor makes."""

    step: int
    extra: Any
    received: bool
    synced: bool = False


@dataclass(frozen=True, slots=True)
class _Ref:
    """A tensor's place in the skeleton: its number on the wire, shape, dtype, and whether
    the source held it on an accelerator."""

    index: int
    shape: tuple[int, ...]
    dtype: Any
    on_device: bool


def hand_over(
    world: World,
    module: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    step: int = 0,
    extra: Any = None,
    rng: bool = True,
    group: Any = None,
) -> HandedOver:
    """Send the job's state from ``world.source_rank`` to each of ``world.fresh_ranks``, and
    to any survivor whose ``step`` is not the source's.

    Call it on every rank after ``world.init_process_group(...)`` and before
    ``DistributedDataParallel(module)`` (whose constructor copies rank 0's module to every
    rank, and rank 0 may be the fresh one). ``module`` and ``optimizer`` are loaded in place
    on a receiving rank; ``step`` and ``extra`` come back in the result. ``rng``: a receiving
    rank also takes the source's RNG states. ``group``: the process group (the world's
    default). A failure in the middle of a step's all_reduce can leave one survivor past that
    step and another not: the survivors' steps are compared (one all_gather), and a survivor
    that differs from the source takes the source's state too, so no step is lost or taken
    twice. Without an agent (torchrun) it returns at once: every rank holds its state.
    """
    if not world.fresh_ranks and world._link is None:
        return HandedOver(step, extra, received=False)
    import torch
    import torch.distributed as dist

    source, fresh = world.source_rank, world.fresh_ranks
    device = _transfer_device(dist, group)
    steps = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world.world_size)]
    dist.all_gather(steps, torch.tensor([int(step)], dtype=torch.int64, device=device), group)
    theirs = int(steps[source].item())
    stale = [r for r, s in enumerate(steps) if r not in fresh and int(s.item()) != theirs]
    receivers = sorted({*fresh, *stale})
    synced = bool(receivers) and module is not None  # every rank passes a module, or none does
    if stale:
        logger.info(
            "hand_over: survivors %s were at steps %s, source rank %d at %d: they take its state",
            stale,
            [int(steps[r].item()) for r in stale],
            source,
            theirs,
        )
    if world.rank == source:
        state = _state(module, optimizer, step, extra, rng)
        tensors: list[torch.Tensor] = []
        skeleton = _strip(state, tensors)
        works = []
        for rank in receivers:
            dist.send_object_list([skeleton], dst=rank, group=group, device=device)
            for index, tensor in enumerate(tensors):
                wire = tensor.detach().to(device).contiguous()
                works.append(dist.isend(wire, dst=rank, group=group, tag=index + 1))
        for work in works:
            if work is not None:
                work.wait()
        return HandedOver(step, extra, received=False, synced=synced)
    if world.rank not in receivers:
        return HandedOver(step, extra, received=False, synced=synced)
    box: list[Any] = [None]
    dist.recv_object_list(box, src=source, group=group, device=device)
    skeleton = box[0]
    misfit = _misfit(skeleton, module, optimizer, source)
    own = {} if module is None or misfit else module.state_dict()
    received: dict[int, torch.Tensor] = {}
    in_place: set[int] = set()
    works = []
    for path, ref in _refs(skeleton):
        target = _own_tensor(own, path, ref, device)
        if target is not None:
            in_place.add(ref.index)
        else:
            target = _empty(ref, device)
        received[ref.index] = target
        works.append(dist.irecv(target, src=source, group=group, tag=ref.index + 1))
    for work in works:
        if work is not None:
            work.wait()
    if misfit:  # raised once all came: the source is not left waiting for this rank
        raise HandOverError(misfit)
    state = _dress(skeleton, lambda ref: _placed(received[ref.index], ref))
    _load(state, module, optimizer, in_place_all=_all_in_place(skeleton, in_place))
    return HandedOver(int(state["step"]), state["extra"], received=True, synced=synced)


# -- the state, as a tree of plain objects and tensors ----------------------------------------


_KEYS = ("module", "optimizer", "step", "extra", "rng")


def _state(
    module: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    extra: Any,
    rng: bool,
) -> dict[str, Any]:
    return {
        "module": None if module is None else dict(module.state_dict()),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "step": int(step),
        "extra": extra,
        "rng": _rng_states() if rng else None,
    }


def _strip(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` with each tensor replaced by a :class:`_Ref` (the tensors appended in order)."""
    import torch

    if isinstance(value, torch.Tensor):
        tensors.append(value)
        ref = _Ref(len(tensors) - 1, tuple(value.shape), value.dtype, value.device.type != "cpu")
        return ref
    if isinstance(value, dict):
        return {key: _strip(item, tensors) for key, item in value.items()}
    if isinstance(value, list):
        return [_strip(item, tensors) for item in value]
    if type(value) is tuple:
        return tuple(_strip(item, tensors) for item in value)
    return value


def _refs(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], _Ref]]:
    """Every :class:`_Ref` in a skeleton, with its path, in wire order."""
    if isinstance(value, _Ref):
        return [(path, value)]
    found: list[tuple[tuple[Any, ...], _Ref]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _refs(item, (*path, key))
    elif isinstance(value, list | tuple):
        for number, item in enumerate(value):
            found += _refs(item, (*path, number))
    return found


def _dress(value: Any, tensor_of: Callable[[_Ref], Any]) -> Any:
    """The skeleton with each :class:`_Ref` replaced by its received tensor."""
    if isinstance(value, _Ref):
        return tensor_of(value)
    if isinstance(value, dict):
        return {key: _dress(item, tensor_of) for key, item in value.items()}
    if isinstance(value, list):
        return [_dress(item, tensor_of) for item in value]
    if type(value) is tuple:
        return tuple(_dress(item, tensor_of) for item in value)
    return value


# -- the receiving side -------------------------------------------------------------------------


def _transfer_device(dist: Any, group: Any) -> Any:
    """Where tensors travel: the accelerator for NCCL, else the CPU (gloo's send and recv)."""
    import torch

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _own_tensor(
    own: dict[str, torch.Tensor], path: tuple[Any, ...], ref: _Ref, device: Any
) -> torch.Tensor | None:
    """This rank's module tensor that ``ref`` can be received into directly, if there is one."""
    if len(path) != 2 or path[0] != "module":
        return None
    tensor = own.get(path[1])
    if (
        tensor is None
        or tuple(tensor.shape) != ref.shape
        or tensor.dtype != ref.dtype
        or tensor.device != device
        or not tensor.is_contiguous()
    ):
        return None
    return tensor


def _empty(ref: _Ref, device: Any) -> torch.Tensor:
    import torch

    return torch.empty(ref.shape, dtype=ref.dtype, device=device)


def _placed(tensor: torch.Tensor, ref: _Ref) -> torch.Tensor:
    """A received tensor where the source held it: this rank's accelerator, or the CPU."""
    import torch

    if ref.on_device and tensor.device.type == "cpu" and torch.cuda.is_available():
        return tensor.to(torch.device("cuda", torch.cuda.current_device()))
    if not ref.on_device and tensor.device.type != "cpu":
        return tensor.cpu()
    return tensor


def _all_in_place(skeleton: dict[str, Any], in_place: set[int]) -> bool:
    module = skeleton.get("module")
    return module is not None and all(ref.index in in_place for _, ref in _refs(module))


def _misfit(
    skeleton: Any,
    module: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    source: int,
) -> str | None:
    """Why the source's hand-over does not fit this rank's arguments, or None."""
    if not isinstance(skeleton, dict) or set(skeleton) != set(_KEYS):
        raise HandOverError(
            f"rank {source} sent no hand-over (it called something else): every rank of the "
            "world must call hand_over at the same point"
        )
    for name, mine in (("module", module), ("optimizer", optimizer)):
        if (skeleton[name] is None) != (mine is None):
            theirs = "no" if skeleton[name] is None else "an" if name == "optimizer" else "a"
            return (
                f"source rank {source} handed over {theirs} {name} and this rank "
                f"{'passed none' if mine is None else 'passed one'}: pass the same arguments "
                "to hand_over on every rank"
            )
    return None


def _load(
    state: dict[str, Any],
    module: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    *,
    in_place_all: bool,
) -> None:
    if module is not None and not in_place_all:
        module.load_state_dict(state["module"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if state["rng"] is not None:
        _set_rng_states(state["rng"])


# -- random number generators ---------------------------------------------------------------------


def _rng_states() -> dict[str, Any]:
    import torch

    states: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    cuda: Any = torch.cuda
    if cuda.is_available() and cuda.is_initialized():  # never initialise CUDA for this
        states["cuda"] = cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(states["torch"].cpu())
    random.setstate(states["random"])
    if "cuda" in states and torch.cuda.is_available():
        cuda = [state.cpu() for state in states["cuda"]]
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])
    numpy = sys.modules.get("numpy")
    if "numpy" in states and numpy is not None:
        numpy.random.set_state(states["numpy"])
