"""A/A comparisons: one policy against itself, the two arms differing only in their plugins'
private randomness (`StepContext.salt`), so that every `better` or `worse` of the comparison table
is false. `compare --aa POLICY --seeds K --trials T` runs T such tables of K paired draws each
(fresh draws and salts for every table) and `false_verdict_rates` counts:

- per metric, the share of tables in which that metric got a verdict (nominal: at most 1 - level);
- per table, the share with at least one verdict anywhere (the family-wise error rate the table's
  correction controls at 1 - level: max-T by default, `--correction`), with its Wilson score
  interval;
- the same two before the correction, from each verdict's own interval (`verdict_uncorrected`).

When the policy draws no private randomness both arms run identically and every table is empty of
verdicts: `identical` says so (such an A/A checks nothing).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

from .min_effect import DEFAULT_CORRECTION
from .paired import CORRECTION_NAMES, paired_comparison


def aa_salts(trial: int, draw: int, seeds: int) -> tuple[int, int]:
    """The plugin salts of the two arms on draw `draw` of table `trial`: distinct for every arm,
    draw and table (independent private randomness)."""
    k = trial * seeds + draw
    return 2 * k + 1, 2 * k + 2


def wilson(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion `successes` / `n`."""
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def false_verdict_rates(tables: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    """The false-verdict rates of A/A `tables` (`paired_comparison` documents, the second arm
    `arm` against the first): see the module docstring."""
    metrics = tables[0]["metrics"]
    directed = [key for key, meta in metrics.items() if meta["direction"] is not None]
    per_metric = {key: {"controlled": 0, "uncorrected": 0} for key in directed}
    any_controlled = any_uncorrected = identical = 0
    for table in tables:
        entries = {key: table["policies"][arm][key]["vs_baseline"] for key in directed}
        hit = {key: e is not None and e["verdict"] not in (None, "no difference") for key, e in entries.items()}
        raw = {key: e is not None and e.get("verdict_uncorrected") not in (None, "no difference") for key, e in entries.items()}
        for key in directed:
            per_metric[key]["controlled"] += hit[key]
            per_metric[key]["uncorrected"] += raw[key]
        any_controlled += any(hit.values())
        any_uncorrected += any(raw.values())
        identical += all(e is None or e["difference"]["low"] == e["difference"]["high"] == 0 for e in entries.values())
    n = len(tables)
    level = tables[0]["level"]
    low, high = wilson(any_controlled, n, level)
    return {
        "tables": n, "seeds": len(tables[0]["seeds"]), "nominal": 1 - level, "error_control": tables[0]["error_control"],
        "tables_with_false_verdict": any_controlled, "table_rate": any_controlled / n, "table_rate_interval": [low, high],
        "tables_with_false_verdict_uncorrected": any_uncorrected, "table_rate_uncorrected": any_uncorrected / n,
        "per_metric": {key: {"label": metrics[key]["label"], "rate": c["controlled"] / n,
                             "rate_uncorrected": c["uncorrected"] / n} for key, c in per_metric.items()},
        "identical": identical == n,
    }


def aa_tables(docs: list[dict[str, Any]], labels: tuple[str, str], seeds: list[int], trials: int,
              min_effect: dict[str, float] | None, correction: str = DEFAULT_CORRECTION) -> list[dict[str, Any]]:
    """The A/A comparison tables of `docs`, ordered table by table, draw by draw, arm by arm (as
    `compare --aa` runs them), each under `correction`; `seeds` are all tables' workload seeds in
    that order."""
    k = len(seeds) // trials
    tables = []
    for t in range(trials):
        block = docs[2 * k * t: 2 * k * (t + 1)]
        runs = {labels[0]: block[0::2], labels[1]: block[1::2]}
        tables.append(paired_comparison(runs, seeds[k * t: k * (t + 1)], labels[0], min_effect=min_effect,
                                        correction=correction))
    return tables


def format_aa(policy: str, rates: dict[str, Any]) -> str:
    """The A/A summary: the table-level and per-metric false-verdict rates against the nominal."""
    n, nominal = rates["tables"], rates["nominal"]
    low, high = rates["table_rate_interval"]
    applied = rates.get("error_control", "holm")
    how = "no correction" if applied == "none" else f"{CORRECTION_NAMES[applied]} over the table"
    lines = [f"A/A of {policy}: {n} tables of {rates['seeds']} paired draws, the arms differing only in their "
             "plugins' private randomness (StepContext.salt)",
             f"tables with a false verdict: {rates['tables_with_false_verdict']}/{n} = {rates['table_rate']:.1%} "
             f"[{low:.1%}, {high:.1%}] (nominal {nominal:.0%}, {how}); without the correction "
             f"{rates['tables_with_false_verdict_uncorrected']}/{n} = {rates['table_rate_uncorrected']:.1%}"]
    if rates["identical"]:
        lines.append(f"note: both arms ran identically on every draw: {policy} draws no private randomness "
                     "(ctx.salt), so this A/A checks nothing")
    width = max(len(m["label"]) for m in rates["per_metric"].values()) + 2
    lines.append(f"{'metric':<{width}}{'false rate':>12}{'uncorrected':>13}")
    for m in rates["per_metric"].values():
        lines.append(f"{m['label']:<{width}}{m['rate']:>12.1%}{m['rate_uncorrected']:>13.1%}")
    return "\n".join(lines) + "\n"
