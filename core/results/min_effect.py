"""The settings of `compare`'s verdicts that its command line needs, apart from
`metroline.core.results.multiplicity` so that building the command line loads no numpy: the
minimum effect a verdict needs, by metric kind (`--min-effect`), and the family-wise corrections
(`--correction`)."""

from __future__ import annotations

MIN_EFFECT: dict[str, float] = {"latency": 0.01, "throughput": 0.005, "count": 0.05, "share": 0.005}
"""The default minimum relative effect of a verdict, by metric kind: latencies 1%, throughputs
0.5%, counts (preemptions, unfinished requests, recomputed tokens) 5%, shares (prefix hit rate,
Jain's index) 0.5%. Smaller differences are `no difference` whatever their p-value."""

CORRECTIONS = ("maxt", "holm", "none")
"""The family-wise corrections of a table's verdicts (`--correction`): Westfall and Young's
step-down max-T over the draws' sign flips, Holm's step-down on the t-tests' p-values, or none
(each verdict's own interval); `metroline.core.results.multiplicity` says what each does."""
DEFAULT_CORRECTION = "maxt"
"""The correction a table gets unless told otherwise."""


def parse_min_effect(text: str | None) -> dict[str, float]:
    """`--min-effect`: one fraction for every kind (`0.02`) or `KIND=FRACTION,...` (`latency=0.02,
    count=0.1`), over `MIN_EFFECT`'s defaults; each >= 0."""
    effect = dict(MIN_EFFECT)
    if text is None:
        return effect
    items = [p.strip() for p in text.split(",") if p.strip()]
    if len(items) == 1 and "=" not in items[0]:
        items = [f"{kind}={items[0]}" for kind in MIN_EFFECT]
    for item in items:
        kind, _, value = item.partition("=")
        if kind not in MIN_EFFECT:
            raise ValueError(f"--min-effect: {kind!r} is not a metric kind ({', '.join(MIN_EFFECT)})")
        try:
            x = float(value)
        except ValueError:
            raise ValueError(f"--min-effect: {item!r}: expected KIND=FRACTION, e.g. latency=0.01") from None
        if not (0 <= x < 10):
            raise ValueError(f"--min-effect: {kind}: must be a fraction >= 0 (0.01 is 1%), got {value}")
        effect[kind] = x
    return effect
