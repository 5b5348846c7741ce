"""Fairness: how the engine's service was shared between tenants, window by window (`fairness`),
from the request records of a `MetricsCollector`."""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Any

from .collector import REJECTED, RequestRecord


def _jain(xs: list[float]) -> float | None:
    total, squares = math.fsum(xs), math.fsum(x * x for x in xs)
    return total * total / (len(xs) * squares) if squares > 0 else None


def fairness(
    records: list[RequestRecord],
    *,
    window_s: float = 60.0,
    w_in: float = 1.0,
    w_out: float = 1.0,
    weights: dict[str, float] | None = None,
) -> dict[str, Any]:
    """How the engine's service was shared between tenants, window by window.

    Whole-run totals hide unfairness (a tenant starved for a minute and served later looks fine),
    so the run, from its first arrival to its last finish, is cut into windows of `window_s`
    seconds (the last one may be shorter). The step log carries no tenants, so everything comes
    from the request records (rejected requests count nowhere):

    - `input`: prompt tokens a request computed, i.e. its prompt minus the prefix-cache hit of its
      first admission, all counted at its `first_token_s` (the end of its prefill; the chunks of a
      chunked prefill are not spread) -- recomputation after a preemption is not service;
    - `output`: output tokens, each at its time in `token_times`;
    - `service`: `w_in * input + w_out * output` (what a tenant was served, in weighted tokens).

    A tenant is *backlogged* in a window when one of its requests was waiting in it: it had arrived
    before the window's end and was first scheduled (or ended without running) after its start.
    This is VTC's notion (a tenant with requests in the queue); a tenant whose requests all run is
    served as fast as the engine goes and is not compared. Over the backlogged
    tenants, with `x = service / weight` (`weights`: {tenant: weight}, 1.0 when unlisted):

    - `jain`: Jain's index (sum x)^2 / (n * sum x^2): 1.0 when every backlogged tenant got the same
      weighted service, 1/n when one got everything; None when no tenant was backlogged or none
      was served;
    - `max_service_gap`: the largest difference of `x` between two backlogged tenants (0.0 with
      one, None with none).

    Returns `{"window_s", "w_in", "w_out", "weights", "windows": [{"start_s", "end_s", "input",
    "output", "service", "backlogged", "jain", "max_service_gap"}], "min_jain", "mean_jain",
    "max_service_gap"}`: per-window dicts map every tenant with a non-rejected request to its
    figure, tenants sorted by name; the last three are over the windows that have a value (None
    when none has).

    Windows are listed sparsely, in time order: those in which a tenant was served or a request
    started or stopped waiting. A window left out had tenants only waiting, or nothing at all: no
    one was served, so it has no Jain's index and a gap of 0 (which `max_service_gap` counts when
    a tenant waited there). So memory and time follow the records, not the run's span over
    `window_s` (two requests a day apart with 1 ms windows make a handful of windows).
    """
    _check_arguments(window_s, w_in, w_out, weights)
    weights = dict(weights or {})
    served = [r for r in records if r.finish_s is not None and r.finish_reason != REJECTED]
    doc: dict[str, Any] = {
        "window_s": float(window_s), "w_in": w_in, "w_out": w_out, "weights": weights,
        "windows": [], "min_jain": None, "mean_jain": None, "max_service_gap": None,
    }
    if not served:
        return doc
    grid = _Grid(min(r.arrival_s for r in served), max(r.finish_s for r in served), window_s)
    tenants = sorted({r.tenant for r in served})
    inputs, outputs, waits = _tally(served, grid, tenants)
    keys = sorted({*inputs, *outputs, *(w[0] for w in waits), *(w[1] for w in waits)})
    backlogged = _backlogged(keys, waits)
    windows, jains, gaps = [], [], []
    zeros = dict.fromkeys(tenants, 0)
    for k in keys:
        ins, outs = inputs.get(k, zeros), outputs.get(k, zeros)
        service = {t: w_in * ins[t] + w_out * outs[t] for t in tenants}
        active = backlogged[k]
        xs = [service[t] / weights.get(t, 1.0) for t in active]
        jain = _jain(xs) if xs else None
        gap = max(xs) - min(xs) if xs else None
        if jain is not None:
            jains.append(jain)
        if gap is not None:
            gaps.append(gap)
        windows.append({
            "start_s": grid.start_of(k), "end_s": grid.end_of(k),
            "input": dict(ins), "output": dict(outs), "service": service, "backlogged": active,
            "jain": jain, "max_service_gap": gap,
        })
    if _windows_waited(waits) > sum(1 for k in keys if backlogged[k]):
        gaps.append(0.0)  # a window left out where tenants only waited: nobody served, gap 0
    doc.update(
        windows=windows,
        min_jain=min(jains) if jains else None,
        mean_jain=math.fsum(jains) / len(jains) if jains else None,
        max_service_gap=max(gaps) if gaps else None,
    )
    return doc


def _check_arguments(window_s: float, w_in: float, w_out: float, weights: dict[str, float] | None) -> None:
    if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be a number > 0, got {window_s!r}")
    for label, w in (("w_in", w_in), ("w_out", w_out)):
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
            raise ValueError(f"{label} must be a number >= 0, got {w!r}")
    for tenant, w in (weights or {}).items():
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0):
            raise ValueError(f"weights[{tenant!r}] must be a number > 0, got {w!r}")


class _Grid:
    """The run's span [start, end] cut into `n` windows of `window_s` (the last may be shorter)."""

    def __init__(self, start: float, end: float, window_s: float) -> None:
        ratio = (end - start) / window_s
        if not math.isfinite(ratio):
            raise ValueError(f"window_s {window_s!r}: the run's span of {end - start!r} s holds too many windows")
        self.start, self.end, self.window_s = start, end, window_s
        self.n = max(1, math.ceil(ratio))

    def index(self, t: float) -> int:
        """The window of time `t`: the last k with start + k * window_s <= t, within [0, n)."""
        start, window_s, n = self.start, self.window_s, self.n
        k = min(max(int((t - start) / window_s), 0), n - 1)
        # the division may round across a boundary: one step fixes it (where a window is finer
        # than a float's resolution at `t`, boundaries are only as exact as the floats)
        if k + 1 < n and start + (k + 1) * window_s <= t:
            k += 1
        elif k > 0 and start + k * window_s > t:
            k -= 1
        return k

    def start_of(self, k: int) -> float:
        return self.start + k * self.window_s

    def end_of(self, k: int) -> float:
        return min(self.start + (k + 1) * self.window_s, self.end) if k == self.n - 1 else self.start + (k + 1) * self.window_s


def _tally(
    served: list[RequestRecord], grid: _Grid, tenants: list[str]
) -> tuple[dict[int, dict[str, int]], dict[int, dict[str, int]], list[tuple[int, int, str]]]:
    """Input and output tokens per window and tenant (only windows where something happens are
    kept: memory follows the records, not the span), and each request's (first, last) window of
    waiting with its tenant."""
    inputs: dict[int, dict[str, int]] = {}
    outputs: dict[int, dict[str, int]] = {}
    waits: list[tuple[int, int, str]] = []
    index = grid.index

    def add(table: dict[int, dict[str, int]], k: int, tenant: str, x: int) -> None:
        row = table.get(k)
        if row is None:
            row = table[k] = dict.fromkeys(tenants, 0)
        row[tenant] += x

    for r in served:
        tenant = r.tenant
        admitted = r.first_scheduled_s if r.first_scheduled_s is not None else r.finish_s
        waits.append((index(r.arrival_s), index(admitted), tenant))
        if r.first_token_s is not None:
            add(inputs, index(r.first_token_s), tenant, r.prompt_tokens - r.cached_prompt_tokens)
        tt = r.token_times
        if not tt:
            continue
        first, last = index(tt[0]), index(tt[-1])
        if first == last:
            add(outputs, first, tenant, len(tt))
        elif last - first > len(tt):  # sparse tokens over many windows: place each token
            for t in tt:
                add(outputs, index(t), tenant, 1)
        else:
            lo = 0
            for k in range(first, last):
                hi = bisect_left(tt, grid.start_of(k + 1), lo)
                if hi > lo:
                    add(outputs, k, tenant, hi - lo)
                lo = hi
            add(outputs, last, tenant, len(tt) - lo)
    return inputs, outputs, waits


def _backlogged(keys: list[int], waits: list[tuple[int, int, str]]) -> dict[int, list[str]]:
    """For each window of `keys` (sorted), the tenants (sorted) with a wait that covers it."""
    by_start = sorted(waits)
    by_end = sorted(waits, key=lambda w: w[1])
    active: dict[str, int] = {}
    i = j = 0
    result = {}
    for k in keys:
        while i < len(by_start) and by_start[i][0] <= k:
            t = by_start[i][2]
            active[t] = active.get(t, 0) + 1
            i += 1
        while j < len(by_end) and by_end[j][1] < k:
            t = by_end[j][2]
            active[t] -= 1
            j += 1
        result[k] = sorted(t for t, c in active.items() if c > 0)
    return result


def _windows_waited(waits: list[tuple[int, int, str]]) -> int:
    """How many windows some tenant waited in (the size of the union of the waits)."""
    total, reach = 0, -1
    for a, b, _ in sorted(waits):
        if b > reach:
            total += b - max(a, reach + 1) + 1
            reach = b
    return total
