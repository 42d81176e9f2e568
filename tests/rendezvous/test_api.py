"""Parameters, the registry and the public surface of aioelastic.rendezvous."""

from __future__ import annotations

from typing import Any

import pytest

import aioelastic.rendezvous as rendezvous
from aioelastic.rendezvous import (
    RendezvousHandler,
    RendezvousHandlerRegistry,
    RendezvousParameterError,
    RendezvousParameters,
)
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.rendezvous._registry import lazy_creator


def make(**config: Any) -> RendezvousParameters:
    return RendezvousParameters("c10d", "localhost:29400", "job", 1, 2, **config)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "e", "r", 1, 1), "backend must be a non-empty string"),
        (("b", "e", "", 1, 1), "run id must be a non-empty string"),
        (("b", "e", "r", 0, 1), "min_nodes must be an integer of at least 1"),
        (("b", "e", "r", 3, 2), r"max_nodes \(2\) must be an integer of at least min_nodes \(3\)"),
    ],
)
def test_parameters_are_validated(args: tuple[Any, ...], message: str) -> None:
    """Bad constructor arguments raise naming the value."""
    with pytest.raises(RendezvousParameterError, match=message):
        RendezvousParameters(*args)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("yes", True), ("T", True), ("1", True), (1, True), ("no", False), ("0", False), (0, False)],
)
def test_get_as_bool_accepts_torchs_spellings(value: Any, expected: bool) -> None:
    """Booleans arrive as strings or ints in torch's spellings."""
    assert make(is_host=value).get_as_bool("is_host") is expected


def test_get_as_bool_and_int_name_the_bad_value() -> None:
    """A value that is not a bool or int names the key and the value."""
    with pytest.raises(RendezvousParameterError, match=r"is_host='maybe' is not a boolean"):
        make(is_host="maybe").get_as_bool("is_host")
    with pytest.raises(RendezvousParameterError, match=r"read_timeout='soon' is not an integer"):
        make(read_timeout="soon").get_as_int("read_timeout")
    assert make().get_as_int("read_timeout", 7) == 7


def test_settings_parse_strings_with_torchs_names() -> None:
    """Config keys arrive as strings under torch's names."""
    settings = ElasticSettings.from_parameters(
        make(join_timeout="20", last_call_timeout="1.5", keep_alive_interval="2")
    )
    assert (settings.join_timeout, settings.last_call_timeout) == (20.0, 1.5)
    assert settings.heartbeat_timeout == 6.0  # keep_alive_interval x keep_alive_max_attempt


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"join_timout": "5"}, "unknown rendezvous option.* join_timout .*known options: "),
        ({"timeout": "5", "join_timeout": "6"}, "join_timeout=6 and its alias timeout=5"),
        ({"last_call_timeout": "-1"}, "last_call_timeout=-1 must be >= 0"),
        ({"join_timeout": "nan"}, "not a finite number"),
        ({"heartbeat_timeout": "2", "keep_alive_interval": "5"}, "must exceed"),
        ({"read_timeout": "-5"}, "read_timeout=-5 must be a positive number"),
        ({"read_timeout": "abc"}, "read_timeout='abc' is not a number"),
    ],
)
def test_bad_settings_are_reported(config: dict[str, Any], message: str) -> None:
    """Unknown keys and bad values are errors naming the key, never silently ignored."""
    with pytest.raises(RendezvousParameterError, match=message):
        ElasticSettings.from_parameters(make(**config))


def test_registering_a_backend_twice_names_both_creators() -> None:
    """A second creator for one backend is refused, naming both."""
    registry = RendezvousHandlerRegistry()
    first, second = lazy_creator("first.module"), lazy_creator("second.module")
    registry.register("x", first)
    registry.register("x", first)  # the same creator again is harmless
    with pytest.raises(RendezvousParameterError, match=r"first\.module.*second\.module"):
        registry.register("x", second)


def test_an_unknown_backend_lists_the_registered_ones() -> None:
    """Creating a handler for an unregistered backend lists what exists."""
    with pytest.raises(RendezvousParameterError, match=r"unknown rendezvous backend 'nope'.*c10d"):
        rendezvous.get_rendezvous_handler(RendezvousParameters("nope", "", "job", 1, 1))


def test_a_handler_of_another_backend_is_refused() -> None:
    """A creator returning a handler whose get_backend() differs is an error."""
    registry = RendezvousHandlerRegistry()
    registry.register("alias", rendezvous.handler_registry._creators["memory"])
    with pytest.raises(RendezvousParameterError, match="returned a handler of backend 'memory'"):
        registry.create_handler(RendezvousParameters("alias", "", "job", 1, 1))


def test_a_backend_whose_module_cannot_load_says_so() -> None:
    """A lazily loaded backend whose module fails to import names the module."""
    registry = RendezvousHandlerRegistry()
    registry.register("ghost", lazy_creator("aioelastic.rendezvous._no_such_backend"))
    with pytest.raises(
        RendezvousParameterError, match=r"importing aioelastic\.rendezvous\._no_such"
    ):
        registry.create_handler(RendezvousParameters("ghost", "", "job", 1, 1))


def test_the_built_in_backends_are_registered() -> None:
    """static, c10d, memory and etcd/etcd-v3 are registered."""
    assert {"static", "c10d", "memory", "etcd", "etcd-v3"} <= set(
        rendezvous.handler_registry.backends()
    )


def test_a_timeout_is_a_timeout_error_and_use_agent_store_a_property() -> None:
    """RendezvousTimeoutError is a TimeoutError; use_agent_store is a property (as in torch)."""
    assert issubclass(rendezvous.RendezvousTimeoutError, TimeoutError)
    assert isinstance(RendezvousHandler.use_agent_store, property)
