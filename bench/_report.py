"""Read the per-part benchmark tables and write BENCHMARKS.md with a chart of the ratios.

Each ``bench/<part>.py`` prints its own right-aligned table with an ``aioelastic`` column, a
reference column (``torch``, ``torchrun`` or ``target``) and its own ratio column, whose
direction differs between parts. :func:`parse_tables` reads those tables back (pure text in,
figures out) and recomputes one *advantage* per figure with a single convention: above 1,
aioelastic is better (faster, more throughput, less CPU or memory); below 1, it is behind.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

REFERENCES = ("torch", "torchrun", "target")
RATIOS = ("ratio", "speed-up", "target/ours")
_VALUE = re.compile(
    r"(?P<pre>.*\S)?\s+(?P<val>[-+]?(?:\d[\d,]*)?\.?\d+(?:[eE][-+]?\d+)?(?:\s?[a-zA-Zµ%/]+)?"
    r"|-|n/a|nan|inf)$"
)
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*)?\.?\d+(?:[eE][-+]?\d+)?|nan|inf")
_NOTE = re.compile(r"\s\((?P<note>[^()]*)\)\s*$")
_UNIT_IN_LABEL = re.compile(r"\((?P<unit>[^()]+)\)\s*$")


@dataclass(frozen=True, slots=True)
class Figure:
    """One row of a benchmark table, with the advantage recomputed (above 1: we are better)."""

    bench: str
    name: str
    unit: str
    ours: float | None
    reference: float | None
    reference_name: str
    printed_ratio: str
    higher_is_better: bool

    @property
    def advantage(self) -> float | None:
        """reference/ours for costs, ours/reference for rates; None when not comparable."""
        ours, ref = self.ours, self.reference
        if ours is None or ref is None or not (ours > 0 and ref > 0):
            return None
        if not (math.isfinite(ours) and math.isfinite(ref)):
            return None
        return ours / ref if self.higher_is_better else ref / ours


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    start: int
    end: int


@dataclass(slots=True)
class _Table:
    title: str
    columns: list[_Column]
    ours: int
    reference: int | None
    ratio: int | None
    rows: list[Figure] = field(default_factory=list)


def number(text: str) -> float | None:
    """The first number in ``text`` (thousands separators allowed), or None."""
    found = _NUMBER.search(text)
    if found is None:
        return None
    try:
        return float(found.group().replace(",", ""))
    except ValueError:
        return None


def higher_is_better(unit: str, name: str) -> bool:
    """Rates (``ops/s``, ``req/s``, throughput) are better high; times, CPU, memory low."""
    return "/s" in unit or "throughput" in name.lower()


def _header(line: str) -> _Table | None:
    columns = [_Column(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", line)]
    names = [c.name for c in columns]
    if "aioelastic" not in names or not any(ref in names for ref in REFERENCES):
        return None
    ours = names.index("aioelastic")
    after = names[ours + 1 :]
    reference = next((ours + 1 + after.index(r) for r in REFERENCES if r in after), None)
    ratio = next((ours + 1 + after.index(r) for r in RATIOS if r in after), None)
    return _Table("", columns, ours, reference, ratio)


def _row(bench: str, table: _Table, line: str) -> Figure | None:
    cols = table.columns
    head = _VALUE.match(line[: cols[table.ours].end])
    if head is None or head.group("pre") is None:
        return None
    pre, ours_text = head.group("pre"), head.group("val")
    note = _NOTE.search(line, cols[table.ours].end)
    if note is not None:  # a remark after the cells, such as "(static backends)"
        line = line[: note.start()]
    labels = cols[: table.ours]
    unit = ""
    label = pre.strip()
    if len(labels) > 1:  # a left-aligned unit column after the name (bench/store.py)
        label, unit = pre[: labels[1].start].strip(), pre[labels[1].start :].strip()

    def cell(index: int | None) -> str:
        if index is None:
            return ""
        return line[cols[index - 1].end : cols[index].end].strip()

    trailing = line[cols[-1].end :].strip()
    suffix = re.sub(_NUMBER, "", ours_text).strip(" ,")
    in_label = _UNIT_IN_LABEL.search(label)
    if not unit:
        if suffix and suffix not in ("-", "n/a"):
            unit = suffix
        elif trailing:
            unit = trailing
        elif in_label:
            unit = in_label.group("unit")
    if len(label) <= 5 and table.title:  # a size column such as N: name the row by its table
        label = f"{table.title}, {labels[0].name}={label}"
    if note is not None:
        label = f"{label} ({note.group('note')})"
    return Figure(
        bench=bench,
        name=label,
        unit=unit,
        ours=number(ours_text),
        reference=number(cell(table.reference)) if table.reference is not None else None,
        reference_name=cols[table.reference].name if table.reference is not None else "",
        printed_ratio=cell(table.ratio),
        higher_is_better=higher_is_better(unit, label),
    )


def parse_tables(bench: str, text: str) -> list[Figure]:
    """Every figure of every aioelastic-vs-reference table printed by ``bench``."""
    figures: list[Figure] = []
    table: _Table | None = None
    title = ""
    for line in text.splitlines():
        if not line.strip():
            table = None
            continue
        header = _header(line)
        if header is not None:
            header.title = title
            table = header
            continue
        if table is not None:
            figure = _row(bench, table, line)
            if figure is not None:
                figures.append(figure)
                continue
            table = None
        title = line.strip().rstrip(":")
    return figures


# -- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchRun:
    """One benchmark module's run: its output and how it ended."""

    bench: str
    command: str
    returncode: int
    seconds: float
    stdout: str
    stderr: str
    when: str = ""
    """When it started and the load then (a partial run keeps older runs' sections)."""

    @property
    def figures(self) -> list[Figure]:
        return parse_tables(self.bench, self.stdout)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


_SECTION = re.compile(
    r"^## (?P<bench>\w+)\n\n`(?P<command>[^`\n]+)`: (?:ok|FAILED \(exit (?P<rc>-?\d+)\)), "
    r"(?P<seconds>\d+) s(?: \((?P<when>[^()\n]*)\))?\n"
    r"(?:(?!^## ).)*?"  # within the section: never into the next one
    r"^<details><summary>raw output</summary>\n\n```\n(?P<output>.*?)\n```\n\n</details>$",
    re.MULTILINE | re.DOTALL,
)


_STDERR = "\n--- stderr (last lines) ---\n"


def runs_in(markdown: str) -> dict[str, BenchRun]:
    """The runs a report written by :func:`render_markdown` shows (by benchmark), read back from
    each section's status line and raw output: what a partial run keeps of the last report."""
    runs = {}
    for found in _SECTION.finditer(markdown):
        stdout, _, stderr = found["output"].partition(_STDERR)
        bench = found["bench"]
        runs[bench] = BenchRun(
            bench,
            found["command"],
            int(found["rc"] or 0),
            float(found["seconds"]),
            "" if stdout == "(no output)" else stdout + "\n",
            stderr,
            found["when"] or "",
        )
    return runs


_OWN_CHART = re.compile(r"^chart: (?P<path>\S+\.png)\s*$", re.MULTILINE)


def render_markdown(
    runs: Sequence[BenchRun],
    machine: Sequence[tuple[str, str]],
    chart: str | None,
    notes: Mapping[str, str] | None = None,
    closing: Sequence[str] = (),
) -> str:
    """BENCHMARKS.md: machine and versions, one table per benchmark, where we are behind.

    A benchmark that prints ``chart: <path>.png`` gets that chart in its section; ``notes``
    (benchmark name -> Markdown, e.g. where the time went) follow its table, before the raw
    output; the note named ``behind`` opens the closing list of where we are behind, and
    ``closing`` (Markdown sections with their own headings) comes before that list. Everything
    written by hand lives in these notes, so a new run loses none of it.
    """
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m bench`), which runs every `bench/<part>.py` in one "
        "go against the reference implementation (PyTorch's, where it has one). **Advantage** is "
        "recomputed with one convention for every row: above 1, aioelastic is better (less time, "
        "CPU or memory, or more throughput); below 1, aioelastic is behind. The *printed ratio* "
        "is the benchmark's own column, whose direction differs between parts.",
        "",
        "The machine is shared with other jobs while benchmarks run, so every figure is noisy; "
        "compare orders of magnitude, not decimals.",
        "",
        "## Machine",
        "",
        *[f"- {key}: {value}" for key, value in machine],
        "",
    ]
    if chart:
        lines += [f"![aioelastic advantage per figure]({chart})", ""]
    behind: list[Figure] = []
    for run in runs:
        figures = run.figures
        status = "ok" if run.returncode == 0 else f"FAILED (exit {run.returncode})"
        status += f", {run.seconds:.0f} s" + (f" ({run.when})" if run.when else "")
        lines += [f"## {run.bench}", "", f"`{run.command}`: {status}", ""]
        for own in _OWN_CHART.finditer(run.stdout):
            lines += [f"![{run.bench}]({own['path']})", ""]
        if figures:
            lines += [
                "| figure | unit | aioelastic | reference | printed ratio | advantage |",
                "|---|---|---:|---:|---:|---:|",
            ]
            for f in figures:
                ref = f"{_fmt(f.reference)} ({f.reference_name})" if f.reference_name else "-"
                adv = f.advantage
                shown = "-" if adv is None else f"{adv:.2f}x" + (" **behind**" if adv < 1 else "")
                lines.append(
                    f"| {f.name} | {f.unit} | {_fmt(f.ours)} | {ref} | {f.printed_ratio or '-'} "
                    f"| {shown} |"
                )
                if adv is not None and adv < 1:
                    behind.append(f)
            lines.append("")
        else:
            lines += ["No table with an aioelastic and a reference column was printed.", ""]
        if notes and run.bench in notes:
            lines += [notes[run.bench].strip(), ""]
        output = run.stdout.strip() or "(no output)"
        if run.returncode != 0 and run.stderr.strip():
            output += "\n--- stderr (last lines) ---\n" + "\n".join(
                run.stderr.strip().splitlines()[-15:]
            )
        lines += ["<details><summary>raw output</summary>", "", "```", output, "```", "", ""]
        lines[-1] = "</details>"
        lines.append("")
    for section in closing:
        lines += [section.strip(), ""]
    lines += ["## Where aioelastic is behind", ""]
    if notes and "behind" in notes:
        lines += [notes["behind"].strip(), "", "Rows below 1.0x in the tables above:", ""]
    if behind:
        lines += [
            f"- {f.bench}: {f.name}: {_fmt(f.ours)} {f.unit} against {_fmt(f.reference)} "
            f"({f.reference_name}), advantage {f.advantage:.2f}x"
            for f in behind
            if f.advantage is not None
        ]
    else:
        lines.append("Nowhere in this run (within the noise of a shared machine).")
    lines.append("")
    return "\n".join(lines)


def render_chart(figures: Iterable[Figure], path: str) -> bool:
    """Draw a horizontal bar per comparable figure (log scale, 1 = parity); False if no data."""
    rows = [
        (f"{f.bench}: {f.name}" + (" [vs target]" if f.reference_name == "target" else ""), adv)
        for f in figures
        if (adv := f.advantage) is not None
    ]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name if len(name) <= 70 else f"{name[:33]}...{name[-34:]}" for name, _ in rows]
    values = [value for _, value in rows if value is not None]
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(rows) + 1.6))
    colors = ["#2a9d8f" if v >= 1 else "#e76f51" for v in values]
    ax.barh(range(len(values)), values, color=colors)
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(range(len(values)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("advantage of aioelastic (log scale; > 1: aioelastic better, < 1: behind)")
    ax.set_title("aioelastic vs reference, per benchmark figure (noisy: shared machine)")
    for index, value in enumerate(values):
        ax.annotate(
            f"{value:,.0f}x" if value >= 100 else f"{value:.2g}x",
            (value, index),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
