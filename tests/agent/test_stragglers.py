"""Straggler scores from step marks (pure): samples, windows, medians and the factor."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic._kinds.agent import RankStepTime
from aioelastic.events._stragglers import StragglerSettings, StragglerWatch, score_window

LIFE = (0, 1)


def paced(
    first: float, step_seconds: float, count: int
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    return tuple(range(count)), tuple(first + i * step_seconds for i in range(count))


def test_the_median_slower_than_the_factor_names_the_rank() -> None:
    """Scores are the fastest median over each rank's; a rank over factor x fastest straggles."""
    window = score_window(0.0, 1.0, {0: [1.0, 1.0, 9.0], 1: [1.2], 2: [1.4]}, StragglerSettings())
    assert window.ranks == (
        RankStepTime(0, 1.0, 1.0, 3),
        RankStepTime(1, 1.2, pytest.approx(1 / 1.2), 1),
        RankStepTime(2, 1.4, pytest.approx(1 / 1.4), 1),
    )
    assert window.stragglers == (2,)


def test_one_rank_alone_is_never_a_straggler() -> None:
    """A window that scored a single rank compares it with nobody."""
    assert score_window(0.0, 1.0, {3: [5.0]}, StragglerSettings()).stragglers == ()


def test_a_window_closes_once_a_mark_past_its_end_and_the_grace_arrived() -> None:
    """Window [0, 1) closes when a mark at 1 + grace is seen, not before."""
    watch = StragglerWatch(StragglerSettings(window=1.0, grace=0.5))
    assert watch.feed(LIFE, 0, *paced(0.0, 0.25, 6)) == []  # marks up to 1.25
    (closed,) = watch.feed(LIFE, 0, (6,), (1.5,))
    assert (closed.start, closed.end) == (0.0, 1.0)
    assert closed.ranks == (RankStepTime(0, 0.25, 1.0, 4),)


def test_work_done_is_the_end_of_a_ranks_step() -> None:
    """Where a rank said its work was done, the wait for its peers is not its step time."""
    watch = StragglerWatch(StragglerSettings(window=10.0))
    steps, times = paced(0.0, 1.0, 5)
    watch.feed(
        LIFE, 0, steps, times, tuple((s, t + 0.2) for s, t in zip(steps, times, strict=True))
    )
    watch.feed(
        LIFE, 1, steps, times, tuple((s, t + 0.9) for s, t in zip(steps, times, strict=True))
    )
    (window,) = watch.finish()
    assert [(r.rank, r.median) for r in window.ranks] == [
        (0, pytest.approx(0.2)),
        (1, pytest.approx(0.9)),
    ]
    assert window.stragglers == (1,)


def test_marks_that_skip_steps_give_the_time_per_step() -> None:
    """A rank marking every 10th step: its samples are the gap over 10."""
    watch = StragglerWatch(StragglerSettings(window=100.0))
    watch.feed(LIFE, 0, (0, 10, 20), (0.0, 5.0, 10.0))
    (window,) = watch.finish()
    assert window.ranks[0].median == pytest.approx(0.5)


def test_no_sample_spans_two_lives() -> None:
    """The gap between a rank's last mark before a restart and its first after is no step."""
    watch = StragglerWatch(StragglerSettings(window=100.0))
    watch.feed((0, 1), 0, (0, 1), (0.0, 1.0))
    watch.feed((1, 2), 0, (0, 1), (50.0, 51.0))
    (window,) = watch.finish()
    assert window.ranks[0].samples == 2


@pytest.mark.parametrize(
    ("environ", "match"),
    [
        ({"AIOELASTIC_STRAGGLER_WINDOW": "soon"}, "AIOELASTIC_STRAGGLER_WINDOW='soon' is not a"),
        ({"AIOELASTIC_STRAGGLER_WINDOW": "0"}, "window must be > 0 seconds"),
        ({"AIOELASTIC_STRAGGLER_FACTOR": "0.75"}, "factor must be > 1"),
    ],
)
def test_bad_settings_say_which_variable_is_wrong(environ: dict[str, str], match: str) -> None:
    """A bad window or factor in the environment is an error naming it."""
    with pytest.raises(ValueError, match=match):
        StragglerSettings.from_env(environ)


def test_settings_default_to_a_minute_and_nvidias_threshold() -> None:
    """Unset: 60 s windows, a straggler is slower than the fastest by 1/0.75."""
    settings = StragglerSettings.from_env({})
    assert (settings.window, settings.factor) == (60.0, pytest.approx(1 / 0.75))


@given(
    st.dictionaries(
        st.integers(0, 8),
        st.lists(st.floats(0.001, 100.0), min_size=1, max_size=5),
        min_size=1,
        max_size=6,
    )
)
def test_scores_lie_in_zero_one_and_the_fastest_scores_one(samples: dict[int, list[float]]) -> None:
    """Every score is in (0, 1]; some rank scores exactly 1; only ranks under 1/factor straggle."""
    settings = StragglerSettings()
    window = score_window(0.0, 1.0, samples, settings)
    scores = {r.rank: r.score for r in window.ranks}
    assert all(0 < s <= 1 for s in scores.values())
    assert max(scores.values()) == 1.0
    assert all(scores[r] < 1 / settings.factor + 1e-12 for r in window.stragglers)
