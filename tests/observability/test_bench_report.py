"""The benchmark report reads every part's printed table and orients every ratio one way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench._report import (
    BenchRun,
    Figure,
    parse_tables,
    render_chart,
    render_markdown,
    runs_in,
)

TIMER = "\n".join(
    [
        f"{'measure':<38} {'aioelastic':>12} {'torch':>12} {'ratio':>8}",
        f"{'expiry p50, 1 timers':<38} {0.35:>12.4g} {512.3:>12.4g} {1463.7:>7.1f}x  ms",
        f"{'throughput, 1 torch client(s)':<38} {12345.0:>12.4g} {6000.0:>12.4g} {2.1:>7.1f}x  "
        "req/s",
        f"{'idle CPU, 1000 timers':<38} {0.2:>12.4g} {'-':>12} {'-':>8}  % of a core",
        "(torch: max_interval=0.1; ratio > 1 means aioelastic is better)",
    ]
)
STORE = "\n".join(
    [
        "TCP store, aioelastic (client and server on uvloop) vs torch.distributed.TCPStore",
        f"{'workload':<34} {'unit':<7} {'aioelastic':>12} {'torch':>12} {'ratio':>7}",
        f"{'sequential set':<34} {'ops/s':<7} {21000.5:>12,.1f} {f'{30000.0:,.1f}':>12} "
        f"{0.70:>7.2f}",
        f"{'fan-out 64 waiters':<34} {'ms':<7} {2.5:>12,.1f} {f'{5.0:,.1f}':>12} {0.5:>7.2f}",
    ]
)
AGENT = "\n".join(
    [
        "agent benchmarks: median of 5 runs, 2 CPUs (noisy if shared)",
        f"{'measure':34} {'aioelastic':>11} {'torchrun':>10} {'speed-up':>9}",
        f"{'trivial 2-worker job, wall (s)':34} {0.5:11.3f} {'   2.000'} {'4.0x':>9}",
    ]
)
RENDEZVOUS = "\n".join(
    [
        "rendezvous benchmarks: median of 3 runs, 2 CPUs (shared)",
        "",
        "formation time, N separate processes over TCP (c10d)",
        f"{'N':>5} {'aioelastic':>12} {'torch':>12} {'speed-up':>9} {'target':>9}",
        f"{2:5} {'     12.0 ms'} {'   1500.0 ms'} {125.0:8.1f}x {'100 ms':>9}",
        f"{'8 st':>5} {'     30.0 ms'} {'     20.0 ms'} {0.7:8.1f}x  (static backends)",
        "",
        "formation time, N handlers in one process (torch has no in-process equivalent)",
        f"{'N':>5} {'memory':>12} {'tcp':>12} {'ops/node':>9} {'target':>9}",
        f"{100:5} {'      5.0 ms'} {'     50.0 ms'} {9.0:9.2f} {'':>9}",
    ]
)


def by_name(figures: list[Figure]) -> dict[str, Figure]:
    return {f.name: f for f in figures}


def test_timer_rows_take_their_unit_from_the_trailing_column() -> None:
    """Times are better low, rates high; a row without torch has no advantage."""
    rows = by_name(parse_tables("timer", TIMER))
    expiry = rows["expiry p50, 1 timers"]
    assert (expiry.unit, expiry.ours, expiry.reference) == ("ms", 0.35, 512.3)
    assert expiry.advantage == pytest.approx(512.3 / 0.35)
    assert rows["throughput, 1 torch client(s)"].advantage == pytest.approx(
        12340 / 6000
    )  # as printed, 4 digits
    assert rows["idle CPU, 1000 timers"].advantage is None
    assert len(rows) == 3


def test_store_rows_use_the_unit_column_and_thousands_separators() -> None:
    """A store throughput below torch's is an advantage below 1; a faster fan-out above 1."""
    rows = by_name(parse_tables("store", STORE))
    assert rows["sequential set"].ours == 21000.5
    assert rows["sequential set"].advantage == pytest.approx(0.70, abs=0.01)
    assert rows["fan-out 64 waiters"].advantage == pytest.approx(2.0)
    assert rows["sequential set"].printed_ratio == "0.70"


def test_agent_rows_take_the_unit_from_the_label() -> None:
    """`(s)` in a row's name is its unit; the torchrun column is the reference."""
    (row,) = parse_tables("agent", AGENT)
    assert (row.unit, row.reference_name, row.advantage) == ("s", "torchrun", 4.0)


def test_size_rows_are_named_by_their_table_and_tables_without_us_are_skipped() -> None:
    """`N` rows get the table title; a table without an aioelastic column is not read."""
    rows = parse_tables("rendezvous", RENDEZVOUS)
    assert [r.name for r in rows] == [
        "formation time, N separate processes over TCP (c10d), N=2",
        "formation time, N separate processes over TCP (c10d), N=8 st (static backends)",
    ]
    assert rows[0].advantage == pytest.approx(125.0)
    assert rows[1].advantage == pytest.approx(20 / 30)


def test_the_report_states_where_aioelastic_is_behind(tmp_path: Path) -> None:
    """BENCHMARKS.md lists machine facts, every figure, and the rows below parity."""
    runs = [
        BenchRun("store", "-m bench.store", 0, 12.0, STORE, ""),
        BenchRun("agent", "-m bench.agent", 1, 3.0, "", "Traceback: boom"),
    ]
    text = render_markdown(runs, [("CPU", "test cpu")], "bench/ratios.png")
    assert "- CPU: test cpu" in text
    assert "![aioelastic advantage per figure](bench/ratios.png)" in text
    assert "| sequential set | ops/s | 21,000 | 30,000 (torch) | 0.70 | 0.70x **behind** |" in text
    behind = text.split("## Where aioelastic is behind")[1]
    assert "sequential set" in behind
    assert "fan-out" not in behind
    assert "FAILED (exit 1)" in text
    assert "Traceback: boom" in text


def test_the_chart_is_a_png(tmp_path: Path) -> None:
    """render_chart writes a PNG when figures are comparable, and nothing otherwise."""
    pytest.importorskip("matplotlib", reason="needs the timeline extra (matplotlib)")
    path = tmp_path / "ratios.png"
    assert render_chart(parse_tables("timer", TIMER), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not render_chart([], str(tmp_path / "none.png"))


def test_a_benchmark_s_own_chart_and_notes_go_in_its_section() -> None:
    """A printed ``chart: <png>`` line and the notes for a benchmark land in its section."""
    runs = [BenchRun("scale", "-m bench.scale", 0, 5.0, "x\nchart: bench/scale.png\n", "")]
    text = render_markdown(runs, [], None, {"scale": "Where the time went: here."})
    section = text.split("## scale")[1]
    assert "![scale](bench/scale.png)" in section
    assert "Where the time went: here." in section


def test_hand_written_sections_and_the_behind_note_have_their_places() -> None:
    """A note precedes its benchmark's raw output; closing sections and the ``behind`` note come
    before the list of rows behind, in that order."""
    runs = [BenchRun("store", "-m bench.store", 0, 5.0, STORE, "")]
    notes = {"store": "Where it went.", "behind": "Targets and standing."}
    text = render_markdown(runs, [], None, notes, ["## Quiet figures\n\nQuiet."])
    section = text.split("## store")[1]
    assert section.index("Where it went.") < section.index("raw output")
    closing = text.split("## Quiet figures")[1]
    assert closing.index("Quiet.") < closing.index("## Where aioelastic is behind")
    behind = text.split("## Where aioelastic is behind")[1]
    assert behind.index("Targets and standing.") < behind.index("- store: sequential set")


_GENERATED_LINE = re.compile(
    r"(|# Benchmarks|## .+|`-m bench\..*|\|.*\||!\[.*\]\(.*\)"
    r"|- (date|CPU|load average .*|OS|Python|aioelastic|torch|anyio|uvloop|etcd): .*"
    r"|- \w+: .+, advantage [\d.]+x|Written by `make bench`.*|The machine is shared with .*"
    r"|Rows below 1\.0x in the tables above:|Nowhere in this run .*|No table with .*)"
)


def test_benchmarks_md_has_no_hand_written_text_outside_bench_notes() -> None:
    """``make bench`` rewrites BENCHMARKS.md from its runs and ``bench/notes/*.md``: text written
    into BENCHMARKS.md itself would be lost by the next run."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "BENCHMARKS.md").read_text()
    for note in sorted((root / "bench" / "notes").glob("*.md")):
        body = note.read_text().strip()
        assert body in text, f"bench/notes/{note.name} differs from its text in BENCHMARKS.md"
        text = text.replace(body, "", 1)
    text = re.sub(r"(?ms)^<details><summary>raw output</summary>$.*?^</details>$", "", text)
    leftover = [line for line in text.splitlines() if not _GENERATED_LINE.fullmatch(line)]
    assert not leftover, (
        "hand-written lines in BENCHMARKS.md outside bench/notes (move them into "
        f"bench/notes/<bench>.md, then into BENCHMARKS.md where make bench puts it): {leftover[:5]}"
    )


def test_a_report_gives_back_the_runs_it_shows() -> None:
    """``runs_in`` reads each section's run back (what ``--only`` keeps of the other benchmarks),
    a failed one with its stderr, and never takes a section without raw output from another."""
    runs = [
        BenchRun("timer", "-m bench.timer", 0, 139.0, TIMER + "\n", "", "2026-12-02 10:00 UTC"),
        BenchRun("store", "-m bench.store", 0, 12.0, STORE + "\n", ""),
        BenchRun("agent", "-m bench.agent", 1, 3.0, "", "Traceback: boom"),
    ]
    text = render_markdown(runs, [], None, {"timer": "A note."})
    raw = r"(?ms)^<details><summary>raw output</summary>$.*?^</details>$"
    back = runs_in(re.sub(raw, "", text, count=2))  # the timer's and store's raw output cut out
    assert list(back) == ["agent"]
    assert back["agent"] == BenchRun("agent", "-m bench.agent", 1, 3.0, "", "Traceback: boom")
    back = runs_in(render_markdown(runs, [], None, {"timer": "A note."}))
    assert back == {run.bench: run for run in runs}
    assert [f.name for f in back["timer"].figures] == [f.name for f in runs[0].figures]
