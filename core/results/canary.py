"""A canary's two arms compared: each arm's TTFT and TPOT (mean and percentiles) with the interval
of the difference canary - baseline and a verdict, from the requests each arm served.

The two arms serve different requests at the same time, so the comparison is not paired request
by request (in simulation the baseline can be the canary's twin instead, the baseline engine on the
canary's own requests, `metroline.core.cluster.twins`: then both are resampled request for request). Latencies of requests close in time are correlated (a queue that builds up delays
every request behind it; a batch slows every sequence in it), so treating requests as independent
would give intervals far too narrow: an A/A canary would be called different often. The unit of
resampling is a *time window* instead (a block bootstrap):

- the run's arrivals are cut into K equal windows, each at least `WINDOW_LIFETIMES` times the
  90th percentile of the requests' end-to-end latency (a request interacts with those it shares
  the queue and the batch with, so shorter windows are not independent) and holding
  `MIN_PER_WINDOW` requests on average, K between `MIN_WINDOWS` and `MAX_WINDOWS`;
- a resample draws K windows with replacement, and both arms take the requests of the same drawn
  windows (the load they met is shared: paired by window); a percentile of a resample is the
  weighted nearest-rank percentile (each request weighted by how often its window was drawn), and
  the estimates use the same definition;
- the interval is the estimate plus or minus Student's t with K - 1 degrees of freedom times the
  resamples' standard deviation (scaled by sqrt(K / (K - 1))). With K as small as 5, a percentile
  interval of the resamples could never be wider than the windows' own spread (all 5 windows on
  one side of zero happen by chance in 1 run of 16), and t's heavier tails account for the
  standard error being estimated from K windows.

That holds while the run spans at least `MIN_WINDOWS` such windows. Near and past capacity it
never does: a queue builds on each arm and lasts, every request's lifetime grows with the run, and
the two arms' queues drift apart as a random walk does (which requests, how long, each arm happened
to get), so the arms' difference is not a level that windows sample independently but one that
accumulates. Forcing 5 windows there called identical arms different in 10-15% of draws (TTFT mean
up to 37%). A split (not a twin) with fewer independent windows uses the *accumulating* model
(`interval_model`, `ACCUMULATING`) instead:

- the arrivals are cut into K windows (`accumulating_rule`), each at least the 90th percentile of
  the requests' time in service (end-to-end latency - TTFT) and holding `MIN_PER_WINDOW` requests
  on average, at most `MAX_WINDOWS`; fewer than `MIN_WINDOWS` and there is no verdict. Each
  window's statistic difference d_j = canary - baseline, with d_0 = 0 (both arms start the
  comparison alike);
- the increments e_j = d_j - d_{j-1} are taken as independent with a common spread: a window
  hands the next one only its queue's length (which the sum carries) and the requests it is
  running (which a window as long as a request's service lets go), so the windows need not be as
  long as a request's whole life, queueing included;
- the run's difference (the mean's is a weighted mean of the d_j; a percentile's lies among the
  windows', mostly the last ones past capacity) is then no more uncertain than the last window's
  d_K, the sum of all K increments: its standard error is sd(e) * sqrt(K), with Student's t on
  K - 1 degrees of freedom. (The mean of the d_j alone would have sd(e) * sqrt(about K / 3); a
  percentile near the end of the run would not, and on a synthetic past-capacity run TTFT p99 was
  then called different in 16% of A/A draws.)

Where the arms' difference is a steady level instead (TPOT past capacity: the batch is full on
both arms) the increments' spread counts each window's noise twice and the interval is wide: the
model is conservative there and sees only large TPOT effects; a canary that falls behind (a queue
growing faster on one arm) shows as increments of one sign and is found quickly.

Each metric has its own interval (at `level`) and verdict; the `verdict` of the whole canary is
`worse` when one metric is worse at the Bonferroni-corrected level (1 - (1 - level) / metrics),
`better` when one is better at that level and none is worse even at `level` (a canary that trades
a worse TTFT for a better TPOT is not called better), else `no difference`.

How much it can be trusted (tests/test_canary_trials.py; simulated clusters of two replicas, one
per arm, linear cost model, about 3/4 of capacity): A/A canaries were called `no difference` in
40 of 40 trials of 600 requests (16 s, 5 windows), 50 of 50 of 1,000 and 46 of 50 of 3,000 (82 s,
about 18 windows); the per-metric 95% intervals held zero in 84% (p99 TTFT, 3,000 requests) to
100% of the trials: a p99 from a few hundred requests per window is the least stable. A canary
whose every step is 30% slower was called `worse` in 39 of 40 trials of 600 requests; 10% slower,
in 10 of 10 of 3,000 and 6 of 40 of 600: a small effect needs a longer canary. Past capacity
(the accumulating model; bench/canary_split_aa.py, Azure conversation trace, 100 draws each): A/A
called different in 0 of 100 draws overall and for every metric at 200 and at 800 requests; a
halved `max_num_seqs` called worse in 58 of 100 at 200 requests and 100 of 100 at 800
(docs/guide/replicas-and-routing.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .stats import BETTER, BOOTSTRAP_SEED, DEFAULT_LEVEL, NO_DIFFERENCE, WORSE, t_quantile

CANARY_METRICS: tuple[tuple[str, str, str | float], ...] = (
    ("ttft_mean", "ttft", "mean"), ("ttft_p50", "ttft", 50.0), ("ttft_p90", "ttft", 90.0), ("ttft_p99", "ttft", 99.0),
    ("tpot_mean", "tpot", "mean"), ("tpot_p50", "tpot", 50.0), ("tpot_p99", "tpot", 99.0),
)
"""(key, latency, statistic) of each compared metric; every one is better lower."""

DEFAULT_RESAMPLES = 2000
MIN_WINDOWS, MAX_WINDOWS = 5, 40
WINDOW_LIFETIMES = 4.0
MIN_PER_WINDOW = 20
WINDOW_BOOTSTRAP, ACCUMULATING = "window_bootstrap", "accumulating"
"""The two interval models of `compare_arms` (its `interval_model`; see the module docstring)."""
_CHUNK_CELLS = 4_000_000


class ArmSamples:
    """One arm's completed requests: arrival time, TTFT, TPOT (None with a single output token)
    and end-to-end latency, in seconds."""

    __slots__ = ("arrival", "e2e", "tpot", "tpot_arrival", "ttft")

    def __init__(self, rows: Iterable[tuple[float, float, float | None, float]]) -> None:
        rows = list(rows)
        self.arrival = np.array([r[0] for r in rows], dtype=float)
        self.ttft = np.array([r[1] for r in rows], dtype=float)
        self.e2e = np.array([r[3] for r in rows], dtype=float)
        with_tpot = [r for r in rows if r[2] is not None]
        self.tpot = np.array([r[2] for r in with_tpot], dtype=float)
        self.tpot_arrival = np.array([r[0] for r in with_tpot], dtype=float)

    @staticmethod
    def of_records(records: Iterable[Any]) -> ArmSamples:
        """The samples of `RequestRecord`s (completed ones only: those with a first token and a
        finish)."""
        rows = []
        for r in records:
            if r.first_token_s is None or r.finish_s is None or r.error is not None:
                continue
            tpot = None
            if r.output_tokens > 1:
                tpot = (r.finish_s - r.first_token_s) / (r.output_tokens - 1)
            rows.append((r.arrival_s, r.first_token_s - r.arrival_s, tpot, r.finish_s - r.arrival_s))
        return ArmSamples(rows)

    def __len__(self) -> int:
        return int(self.arrival.size)

    def latency(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        return (self.ttft, self.arrival) if which == "ttft" else (self.tpot, self.tpot_arrival)


def window_count(span: float, e2e: np.ndarray, requests: int) -> int:
    """How many windows the bootstrap cuts `span` seconds into: each at least `WINDOW_LIFETIMES`
    times the 90th percentile of the requests' end-to-end latency (a request's latency depends on
    those it shared the batch and the queue with: windows shorter than that are not independent,
    and the interval would be too narrow) and holding `MIN_PER_WINDOW` requests on average; at
    most `MAX_WINDOWS`. Fewer than `MIN_WINDOWS` means the run is too short for an interval
    (`compare_arms` then gives no verdict on a split)."""
    return window_rule(span, e2e, requests)[0]


def window_rule(span: float, e2e: np.ndarray, requests: int) -> tuple[int, str]:
    """`window_count` and the reason for it, in words."""
    life = float(np.percentile(e2e, 90)) if e2e.size else 0.0
    by_time = int(span / (WINDOW_LIFETIMES * life)) if life > 0 else MAX_WINDOWS
    by_count = requests // MIN_PER_WINDOW
    k = int(min(MAX_WINDOWS, by_time, by_count))
    if k == MAX_WINDOWS:
        return k, f"at most {MAX_WINDOWS} windows"
    if by_time <= by_count:
        return k, (f"{span:.1f} s of arrivals in windows of at least {WINDOW_LIFETIMES:g} x the p90 end-to-end "
                   f"latency ({life:.2f} s)")
    return k, f"{requests} requests in windows of at least {MIN_PER_WINDOW} on average"


def accumulating_rule(span: float, service: np.ndarray, requests: int) -> tuple[int, str]:
    """The window count of the `ACCUMULATING` model and its reason: windows at least the 90th
    percentile of the requests' time in service (end-to-end latency - TTFT: the requests a window
    is running are, with the queue's length, what it hands the next window, so shorter windows'
    increments are not independent) and holding `MIN_PER_WINDOW` requests on average; at most
    `MAX_WINDOWS`."""
    life = float(np.percentile(service, 90)) if service.size else 0.0
    by_time = int(span / life) if life > 0 else MAX_WINDOWS
    by_count = requests // MIN_PER_WINDOW
    k = int(min(MAX_WINDOWS, by_time, by_count))
    if k == MAX_WINDOWS:
        return k, f"at most {MAX_WINDOWS} windows"
    if by_time <= by_count:
        return k, f"{k} windows of at least the p90 time in service ({life:.2f} s)"
    return k, f"{k} windows of at least {MIN_PER_WINDOW} requests on average"


def _weighted(values: np.ndarray, weights: np.ndarray, statistic: str | float) -> np.ndarray:
    """`statistic` of `values` (sorted ascending) under each row of `weights`: the weighted mean
    or nearest-rank percentile (NaN for a row of zero weight)."""
    total = weights.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        if statistic == "mean":
            return weights @ values / total
        cum = np.cumsum(weights, axis=1)
        target = np.maximum(float(statistic) / 100.0 * total, 1e-12)
        rank = (cum < target[:, None]).sum(axis=1)
        out = values[np.minimum(rank, values.size - 1)]
    out[total == 0] = np.nan
    return out


def _resampled(values: np.ndarray, window: np.ndarray, counts: np.ndarray, statistic: str | float) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    v, w = values[order], window[order]
    out = np.empty(counts.shape[0])
    rows = max(1, _CHUNK_CELLS // max(1, v.size))
    for start in range(0, counts.shape[0], rows):
        block = counts[start:start + rows]
        out[start:start + rows] = _weighted(v, block[:, w].astype(float), statistic)
    return out


def compare_arms(
    baseline: ArmSamples, canary: ArmSamples, *, level: float = DEFAULT_LEVEL, windows: int | None = None,
    resamples: int = DEFAULT_RESAMPLES, seed: int = BOOTSTRAP_SEED, split: bool = True,
) -> dict[str, Any]:
    """The comparison (see the module docstring) as a JSON-ready dict: `requests` per arm,
    `windows` (K; `windows` sets it instead of the rule) and `window_reason` (why K), `level`,
    `metrics` (key -> `baseline`, `canary`, `difference` {estimate, low, high}, `relative`
    (difference / baseline), `verdict`) and the overall `verdict`. Either arm without a completed
    request: every verdict is None.

    `interval_model` names the model: `WINDOW_BOOTSTRAP`, or with `split` (the arms served
    different requests, as at a serving front) and fewer than `MIN_WINDOWS` independent windows
    by the rule (a run shorter than 20 request lifetimes, as one near or past capacity always is:
    its queue, and with it every lifetime, grows with the run) `ACCUMULATING`, over
    `requests // MIN_PER_WINDOW` windows; with fewer than `MIN_WINDOWS` of those (under 100
    requests) the estimates are given, every verdict is None and `window_reason` says why.
    Against a twin (`split=False`: the same requests, paired) the window bootstrap with at least
    `MIN_WINDOWS`."""
    n = len(baseline) + len(canary)
    out: dict[str, Any] = {"requests": {"baseline": len(baseline), "canary": len(canary)}, "level": level,
                           "metrics": {}, "verdict": None}
    if not len(baseline) or not len(canary):
        out["windows"] = 0
        return out
    start = float(min(baseline.arrival.min(), canary.arrival.min()))
    span = float(max(baseline.arrival.max(), canary.arrival.max())) - start
    model = WINDOW_BOOTSTRAP
    if windows:
        k, reason = windows, "as asked"
    else:
        k, reason = window_rule(span, np.concatenate([baseline.e2e, canary.e2e]), n)
    short = False
    if k < MIN_WINDOWS and not windows and not split:
        k, reason = MIN_WINDOWS, reason + f"; {MIN_WINDOWS} at least, paired request for request"
    elif k < MIN_WINDOWS and not windows:
        model = ACCUMULATING
        service = np.concatenate([arm.e2e - arm.ttft for arm in (baseline, canary)])
        k, why = accumulating_rule(span, service, n)
        reason += f": fewer than {MIN_WINDOWS} independent windows, so the arms' difference is taken as accumulating: {why}"
        if k < MIN_WINDOWS:
            short = True
            reason += f": fewer than {MIN_WINDOWS}, too short to compare (no verdict)"
    k = max(k, 2)
    width = span / k if span > 0 else 1.0
    if model == WINDOW_BOOTSTRAP:
        rng = np.random.default_rng(seed)
        counts = rng.multinomial(k, np.full(k, 1.0 / k), size=resamples)
    worse = better = any_worse = False
    for key, which, statistic in CANARY_METRICS:
        windowed, estimates = [], []
        for arm in (baseline, canary):
            values, arrival = arm.latency(which)
            if not values.size:
                break
            windowed.append((values, np.minimum(((arrival - start) / width).astype(int), k - 1)))
            estimates.append(float(_weighted(np.sort(values), np.ones((1, values.size)), statistic)[0]))
        if len(estimates) < 2:
            out["metrics"][key] = None
            continue
        estimate = estimates[1] - estimates[0]
        if model == WINDOW_BOOTSTRAP:
            diff = (_resampled(*windowed[1], counts, statistic) - _resampled(*windowed[0], counts, statistic))
            diff = diff[np.isfinite(diff)]
            se = float(diff.std(ddof=1)) * math.sqrt(k / (k - 1)) if diff.size > 1 else 0.0
            df = k - 1
        else:
            se, df = _accumulating_se(windowed[0], windowed[1], k, statistic)
        t_level = t_quantile(1 - (1 - level) / 2, df)
        t_strict = t_quantile(1 - (1 - level) / len(CANARY_METRICS) / 2, df)
        low, high = estimate - t_level * se, estimate + t_level * se
        s_low, s_high = estimate - t_strict * se, estimate + t_strict * se
        verdict = WORSE if low > 0 else BETTER if high < 0 else NO_DIFFERENCE
        worse |= s_low > 0
        better |= s_high < 0
        any_worse |= low > 0
        base = estimates[0]
        out["metrics"][key] = {
            "baseline": estimates[0], "canary": estimates[1],
            "difference": {"estimate": estimate, "low": low, "high": high},
            "relative": ({"estimate": estimate / base, "low": low / base, "high": high / base} if base else None),
            "verdict": verdict,
        }
    out["windows"] = k
    out["window_reason"] = reason
    out["interval_model"] = model
    out["verdict"] = WORSE if worse else BETTER if better and not any_worse else NO_DIFFERENCE
    if short:
        out["verdict"] = None
        for m in out["metrics"].values():
            if m is not None:
                m["verdict"] = None
    return out


def _accumulating_se(baseline: tuple[np.ndarray, np.ndarray], canary: tuple[np.ndarray, np.ndarray], k: int,
                     statistic: str | float) -> tuple[float, int]:
    """The standard error of the arms' difference in `statistic` when that difference accumulates
    over the run (`ACCUMULATING`, see the module docstring), and its degrees of freedom: from each
    arm's (values, window index) over `k` windows, the windows both arms have requests in give
    d_1..d_m (canary - baseline), d_0 = 0; the increments e_j = d_j - d_{j-1}, taken as
    independent with a common spread, give the spread of the last window's difference d_m, the
    sum of all m: se = sd(e) * sqrt(m), on m - 1 degrees of freedom."""
    d = []
    for j in range(k):
        in_window = [values[window == j] for values, window in (baseline, canary)]
        if all(v.size for v in in_window):
            b, c = (float(_weighted(np.sort(v), np.ones((1, v.size)), statistic)[0]) for v in in_window)
            d.append(c - b)
    m = len(d)
    if m < 2:
        return 0.0, 1
    e = np.diff(np.concatenate([[0.0], d]))
    return float(e.std(ddof=1) * math.sqrt(m)), m - 1


def format_canary(name: str, comparison: dict[str, Any]) -> str:
    """The comparison as a terminal table (milliseconds)."""
    req = comparison["requests"]
    base = "baseline (twin: the canary's own requests)" if comparison.get("pairing") == "twin" else "baseline"
    head = (f"canary {name}: {base} {req['baseline']} requests, canary {req['canary']} requests, "
            f"{comparison.get('windows', 0)} windows, {comparison['level']:.0%} intervals: "
            f"verdict {comparison['verdict'] or '-'}")
    lines = [head]
    if comparison.get("window_reason"):
        lines.append(f"  windows: {comparison['window_reason']}")
    lines.append(f"  {'metric':<10} {'baseline':>10} {'canary':>10} {'canary - baseline [interval]':>36}  verdict")
    for key, m in comparison["metrics"].items():
        if m is None:
            lines.append(f"  {key:<10} {'-':>10} {'-':>10}")
            continue
        d = m["difference"]
        rel = m["relative"]
        rel_text = f" ({rel['estimate']:+.1%})" if rel else ""
        lines.append(f"  {key:<10} {m['baseline'] * 1e3:8.1f}ms {m['canary'] * 1e3:8.1f}ms "
                     f"{d['estimate'] * 1e3:+9.1f} [{d['low'] * 1e3:+.1f}, {d['high'] * 1e3:+.1f}] ms{rel_text:>10}  "
                     f"{m['verdict']}")
    return "\n".join(lines) + "\n"


def samples_of_rows(rows: Sequence[Sequence[Any]]) -> ArmSamples:
    """`ArmSamples` of JSON rows `[arrival_s, ttft_s, tpot_s or null, e2e_s]` (what a server
    reports)."""
    return ArmSamples((float(a), float(t), None if p is None else float(p), float(e)) for a, t, p, e in rows)
