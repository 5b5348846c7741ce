"""`metroline.core.workloads.resample`: new draws of a trace for each seed (redraw, random window)."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from metroline.core.workloads.build import WorkloadError, WorkloadItem
from metroline.core.workloads.resample import capped_gaps, parse_method, random_window, redraw, resample


def trace(n: int = 400) -> list[WorkloadItem]:
    """A bursty trace: pairs of requests 0.01 s apart every 1 s; lengths that vary with the row;
    the first two blocks of every prompt shared by rows of the same parity (as Mooncake's ids)."""
    items = []
    for i in range(n):
        t = (i // 2) * 1.0 + (i % 2) * 0.01
        segments = ((("blk", i % 2, 0), 512), (("blk", i % 2, 1), 512), (("own", i), 10 + i % 37))
        items.append(WorkloadItem(t, segments, 1 + (i * 7) % 50, tenant=f"t{i % 3}", priority=i % 2))
    return items


def row_of(item: WorkloadItem) -> tuple:
    return (item.prompt_len, item.output_len, item.tenant, item.priority, item.segments[:-1])


def test_a_redraw_is_a_function_of_the_seed():
    items = trace()
    assert redraw(items, 3) == redraw(items, 3)
    assert redraw(items, 3) != redraw(items, 4)
    assert resample(items, 3) == redraw(items, 3)


def test_a_redraw_keeps_the_size_and_draws_whole_rows_of_the_trace():
    items = trace()
    rows = Counter(row_of(it) for it in items)
    drawn = redraw(items, 1)
    assert len(drawn) == len(items)
    assert all(row_of(it) in rows for it in drawn)
    assert len({row_of(it) for it in drawn}) < len(rows)  # with replacement: some rows twice, some never


def test_a_redraw_draws_its_gaps_from_the_trace_and_starts_at_zero():
    items = trace()
    trace_gaps = {round(b.arrival_s - a.arrival_s, 9) for a, b in zip(items, items[1:])}
    drawn = redraw(items, 2)
    times = [it.arrival_s for it in drawn]
    assert times[0] == 0.0 and times == sorted(times)
    assert {round(b - a, 9) for a, b in zip(times, times[1:])} <= trace_gaps


def test_redraws_keep_the_trace_rate_on_average():
    items = trace()
    span = items[-1].arrival_s - items[0].arrival_s
    spans = [redraw(items, s)[-1].arrival_s for s in range(40)]
    assert statistics.mean(spans) == pytest.approx(span, rel=0.03)
    assert len(set(spans)) > 30


def test_a_redraw_shares_only_the_prefixes_the_trace_shares():
    drawn = redraw(trace(), 5)
    last_keys = [it.segments[-1][0] for it in drawn]
    assert len(set(last_keys)) == len(drawn)  # a row drawn twice does not share its whole prompt
    assert {it.segments[0][0] for it in drawn} == {("blk", 0, 0), ("blk", 1, 0)}


def test_a_window_holds_the_trace_requests_of_a_random_stretch():
    items = trace()
    w = random_window(items, 7, 30.0)
    assert w == random_window(items, 7, 30.0)
    assert all(0.0 <= it.arrival_s < 30.0 for it in w)
    # the window's requests are consecutive rows of the trace, shifted by one offset
    first = next(i for i, it in enumerate(items) if it.segments == w[0].segments)
    offset = items[first].arrival_s - w[0].arrival_s
    for it, orig in zip(w, items[first:]):
        assert it.segments == orig.segments and it.output_len == orig.output_len
        assert it.arrival_s == pytest.approx(orig.arrival_s - offset)
    assert len(w) in (59, 60, 61)  # two requests a second
    starts = {random_window(items, s, 30.0)[0].segments for s in range(10)}
    assert len(starts) > 5


def test_resample_refuses_what_it_cannot_draw():
    items = trace(10)
    with pytest.raises(WorkloadError, match="does not fit"):
        random_window(items, 0, 100.0)
    with pytest.raises(WorkloadError, match="the 'window' method needs its number \\(seconds\\)"):
        resample(items, 0, "window")
    with pytest.raises(WorkloadError, match="the 'gamma' method needs its number \\(burstiness\\)"):
        resample(items, 0, "gamma")
    with pytest.raises(WorkloadError, match="the 'redraw' method takes no parameter"):
        resample(items, 0, "redraw", 5.0)
    with pytest.raises(WorkloadError, match="unknown method"):
        resample(items, 0, "shuffle")
    with pytest.raises(WorkloadError, match="no requests"):
        resample([], 0)
    single = [WorkloadItem(0.0, ((("x",), 4),), 2)]
    assert len(redraw(single, 1)) == 1


def test_a_redraw_caps_idle_gaps_at_the_traces_p99_gap():
    # 200 gaps of 0.5 s and 2 idle gaps of 500 s (1% of 202 is 2.02, so the p99 gap is 0.5 s)
    times, t = [], 0.0
    for i in range(203):
        times.append(t)
        t += 500.0 if i in (50, 150) else 0.5
    items = [WorkloadItem(x, ((("own", i), 8),), 4) for i, x in enumerate(times)]
    for seed in range(20):
        arrivals = [it.arrival_s for it in redraw(items, seed)]
        assert max(b - a for a, b in zip(arrivals, arrivals[1:])) == 0.5
    assert capped_gaps(items) == [0.5] * 202


def test_gamma_arrivals_have_the_traces_rate_and_the_chosen_burstiness():
    items = trace()
    span = items[-1].arrival_s - items[0].arrival_s
    mean_gap = span / (len(items) - 1)
    for b in (0.25, 1.0, 4.0):
        gaps = [g for s in range(10) for g in _gaps(resample(items, s, "gamma", b))]
        assert statistics.mean(gaps) == pytest.approx(mean_gap, rel=0.05)
        cv2 = statistics.variance(gaps) / statistics.mean(gaps) ** 2  # a gamma of shape b: 1 / b
        assert cv2 == pytest.approx(1 / b, rel=0.15)
    assert resample(items, 1, "gamma", 1.0) == resample(items, 1, "gamma", 1.0) != resample(items, 2, "gamma", 1.0)
    assert parse_method("gamma:0.5") == ("gamma", 0.5)
    with pytest.raises(WorkloadError, match="'gamma:0'"):
        parse_method("gamma:0")


def _gaps(items):
    return [b.arrival_s - a.arrival_s for a, b in zip(items, items[1:])]
