"""The fork template's pure parts: its message codec, the fork-safety checks, argv splitting."""

from __future__ import annotations

import contextlib
import json
import types
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.agent._template_checks import (
    cuda_refusal,
    derive_seed,
    fd_collision,
    script_path0,
    socket_refusal,
    thread_refusal,
    user_seeded,
)
from aioelastic.agent._template_codec import (
    MAX_FDS,
    MAX_MESSAGE,
    Fork,
    Forked,
    Import,
    Imported,
    Message,
    Ready,
    Reap,
    Reaped,
    Refused,
    TemplateCodecError,
    check_module_names,
    decode,
    encode,
)
from aioelastic.agent._template_command import PythonCommand, python_command, template_env

ids = st.integers(min_value=-(2**63), max_value=2**63 - 1)
texts = st.text()
names = st.lists(st.text(), max_size=5).map(tuple)
messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(
        Fork,
        ids,
        st.sampled_from(["script", "module"]),
        texts,
        names,
        st.dictionaries(texts, texts, max_size=5),
        texts,
        st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=MAX_FDS).map(tuple),
        ids,
    ),
    st.builds(Reap, ids, ids),
    st.builds(Import, ids, names, st.booleans()),
    st.builds(Ready, ids, ids, ids),
    st.builds(Forked, ids, ids),
    st.builds(Reaped, ids, ids, ids),
    st.builds(Imported, ids, names, names),
    st.builds(Refused, ids, texts, st.booleans()),
)


@given(messages)
def test_every_message_survives_a_round_trip(message: Message) -> None:
    """decode(encode(m)) is m, for every message type and any field values."""
    assert decode(encode(message)) == message


@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_the_codec_error(data: bytes) -> None:
    """A corrupt packet raises TemplateCodecError, never anything else."""
    with contextlib.suppress(TemplateCodecError):
        decode(data)


@given(
    st.dictionaries(
        st.sampled_from(["type", "id", "pid", "kind", "target", "args", "env", "cwd", "fds"]),
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(), st.lists(st.integers())),
    )
)
def test_objects_with_wrong_fields_raise_the_codec_error(fields: dict[str, object]) -> None:
    """JSON objects with missing or mistyped fields are refused with the codec error."""
    with contextlib.suppress(TemplateCodecError):
        decode(json.dumps(fields).encode())


@pytest.mark.parametrize(
    ("packet", "message"),
    [
        (b"[]", "a message is a JSON object, not list"),
        (b'{"type": "bogus"}', "unknown message type 'bogus'"),
        (b'{"type": "reap", "id": 1, "pid": true}', "field 'pid' must be an integer, not True"),
        (b'{"type": "refused", "id": 1, "reason": "x", "fatal": 1}', "field 'fatal' must be"),
        (b"\xff", "not a JSON message"),
    ],
)
def test_malformed_packets_say_what_is_wrong(packet: bytes, message: str) -> None:
    """The codec error names the field or the problem."""
    with pytest.raises(TemplateCodecError, match=message.replace("(", r"\(")):
        decode(packet)


def test_a_fork_with_too_many_descriptors_is_refused() -> None:
    """A fork names at most MAX_FDS descriptors."""
    fork = Fork(1, "script", "t.py", (), {}, "/", tuple(range(MAX_FDS + 1)), 0)
    with pytest.raises(TemplateCodecError, match="at most 16 descriptor numbers"):
        decode(encode(fork))


def test_an_oversized_environment_cannot_be_encoded() -> None:
    """An environment beyond MAX_MESSAGE fails to encode, saying so."""
    fork = Fork(1, "script", "t.py", (), {"BIG": "x" * MAX_MESSAGE}, "/", (0, 1, 2), 0)
    with pytest.raises(TemplateCodecError, match="cannot be sent to the template"):
        encode(fork)


@pytest.mark.parametrize("bad", ["", "1torch", "torch..nn", "my-model", "a b"])
def test_module_names_are_checked(bad: str) -> None:
    """A malformed module name is refused, quoting it."""
    with pytest.raises(ValueError, match=f"{bad!r} is not a module name"):
        check_module_names(["torch", bad])


def test_dotted_module_names_pass() -> None:
    """Dotted names pass unchanged."""
    assert check_module_names(["torch", "torch.nn", "my_model"]) == (
        "torch",
        "torch.nn",
        "my_model",
    )


# -- the fork-safety checks -------------------------------------------------------------------


def test_a_single_thread_may_fork() -> None:
    """Threads: 1 in /proc/self/status means no refusal."""
    assert thread_refusal("Name:\tpython\nThreads:\t1\n", [], []) is None


def test_extra_threads_are_refused_by_name() -> None:
    """More threads: the refusal names the Python threads and the OS tasks."""
    reason = thread_refusal("Threads:\t3\n", ["heartbeat"], ["python", "pool-1"])
    assert reason is not None
    assert "3 threads" in reason
    assert "'heartbeat'" in reason
    assert "'pool-1'" in reason
    assert "start the threads in the worker" in reason


def test_native_threads_only_say_so() -> None:
    """Threads that Python does not know of are reported as native."""
    reason = thread_refusal("Threads:\t2\n", [], ["omp"])
    assert reason is not None
    assert "none (native threads only)" in reason


def fake_torch(initialized: bool) -> types.SimpleNamespace:
    return types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: initialized))


def test_initialised_cuda_is_refused() -> None:
    """A torch whose CUDA is initialised is refused, saying that workers start CUDA themselves."""
    reason = cuda_refusal({"torch": fake_torch(True)})
    assert reason is not None
    assert "CUDA is initialised in the template" in reason
    assert "workers initialise CUDA themselves" in reason


@pytest.mark.parametrize("modules", [{}, {"torch": fake_torch(False)}, {"torch": object()}])
def test_no_initialised_cuda_may_fork(modules: dict[str, object]) -> None:
    """No torch, torch without CUDA initialised, or a torch without cuda: no refusal."""
    assert cuda_refusal(modules) is None


def test_a_socket_other_than_the_control_socket_is_refused() -> None:
    """A socket a preloaded module opened would reach every worker: refused, naming the fd."""
    links = {0: "/dev/null", 3: "socket:[11]", 7: "socket:[12]", 8: "pipe:[4]"}
    assert socket_refusal(links, own={3}) is not None
    assert "descriptor(s) [7]" in (socket_refusal(links, own={3}) or "")
    assert socket_refusal({0: "/dev/null", 3: "socket:[11]"}, own={3}) is None


def test_descriptor_targets_held_by_the_template_collide() -> None:
    """A passed descriptor's number that the template uses for its own file is a collision;
    the standard streams and the template's request descriptors never are."""
    links = {0: "/dev/null", 1: "pipe:[1]", 5: "/lib/data", 9: "socket:[3]"}
    assert fd_collision([0, 1, 2, 9], links, own={9}) is None
    reason = fd_collision([0, 1, 2, 5], links, own={9})
    assert reason is not None
    assert "[5]" in reason
    assert "/lib/data" in reason


@given(st.integers(min_value=0, max_value=2**64), st.integers(0, 1000), st.integers(0, 100))
def test_seeds_are_64_bit_and_differ_between_ranks(seed: int, rank: int, restart: int) -> None:
    """Each (rank, restart) gets its own 64-bit seed; the same inputs give the same seed."""
    mine = derive_seed(seed, str(rank), str(restart))
    assert 0 <= mine < 2**64
    assert mine == derive_seed(seed, str(rank), str(restart))
    assert mine != derive_seed(seed, str(rank + 1), str(restart))
    assert mine != derive_seed(seed, str(rank), str(restart + 1))


def test_generators_a_preloaded_module_seeded_are_kept() -> None:
    """random and torch keep a seed a preloaded module set; the others are reseeded."""
    assert user_seeded(False, False) == frozenset()
    assert user_seeded(True, False) == {"random"}
    assert user_seeded(True, True) == {"random", "torch"}


def test_sys_path0_is_the_scripts_real_directory_or_the_cwd(tmp_path: Path) -> None:
    """``python dir/t.py`` puts dir first (symlinks resolved); ``python -m`` the directory."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "t.py").touch()
    (tmp_path / "link.py").symlink_to(real / "t.py")
    assert script_path0("script", "real/t.py", str(tmp_path)) == str(real)
    assert script_path0("script", "link.py", str(tmp_path)) == str(real)
    assert script_path0("script", str(real / "t.py"), "/") == str(real)
    assert script_path0("module", "pkg.main", str(tmp_path)) == str(tmp_path)


# -- what can be forked ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["/py/python3", "-u", "train.py", "--lr", "1"],
            PythonCommand("/py/python3", ("-u",), "script", "train.py", ("--lr", "1")),
        ),
        (
            ["python", "-u", "-m", "pkg.train", "-x"],
            PythonCommand("python", ("-u",), "module", "pkg.train", ("-x",)),
        ),
        (
            ["python3.11", "-X", "dev", "-W", "error", "t.py"],
            PythonCommand("python3.11", ("-X", "dev", "-W", "error"), "script", "t.py", ()),
        ),
        (["python", "--", "t.py"], PythonCommand("python", (), "script", "t.py", ())),
    ],
)
def test_python_command_lines_split(argv: list[str], expected: PythonCommand) -> None:
    """Interpreter options, script or -m module, and the rest as the script's arguments."""
    assert python_command(argv) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/bin/sh", "run.sh"], "the worker program is '/bin/sh'"),
        (["python", "-c", "pass"], "python -c"),
        (["python", "-u"], "a script or -m module"),
        (["python", "-"], "a script or -m module"),
        (["python", "-m"], "-m needs a module name"),
        (["python", "-X"], "needs a value"),
    ],
)
def test_what_cannot_be_forked_says_why(argv: list[str], message: str) -> None:
    """A program, -c code or stdin cannot be forked from a Python template."""
    with pytest.raises(ValueError, match=message):
        python_command(argv)


def test_the_template_environment_is_the_workers_without_ranks() -> None:
    """The template imports with the workers' settings (OMP_NUM_THREADS=1 for several)."""
    env = template_env({"PATH": "/bin"}, {"X": "1"}, local_world_size=2)
    assert env["X"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"
    assert "RANK" not in env
    assert "OMP_NUM_THREADS" not in template_env({}, {}, local_world_size=1)
    assert template_env({"OMP_NUM_THREADS": "4"}, {}, 2)["OMP_NUM_THREADS"] == "4"
