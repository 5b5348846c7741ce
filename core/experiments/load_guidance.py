"""The load guidance of the comparisons page (docs/guide/comparisons.md), generated from the load check itself
(`metroline.core.experiments.load_check`), so that its figures cannot go stale.

Each case (`CASES`) is one run of a built-in workload on the default engine, at a `--rate-scale`,
under a cost model; the check's verdict on it (light, fine, heavy or short), the capacity it
estimates and the `--rate-scale` it suggests make one row of a table. That page holds the text
between the markers `<!-- load-guidance:start -->` and `<!-- load-guidance:end -->`.
`python -m metroline.core.experiments.load_guidance --write` reruns every case and rewrites it;
`--check` exits 1 when it differs (tests/test_load_guidance.py checks each row). A case on a trace
needs the traces folder (`metroline.core.workloads.traces.find_traces_dir`).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import load_check

START, END = "<!-- load-guidance:start -->", "<!-- load-guidance:end -->"
DOCUMENT = "docs/guide/comparisons.md"
"""The document holding the guidance, relative to the repository root."""


@dataclass(frozen=True)
class Case:
    """One run the guidance reports: a built-in workload (its first `max_requests` requests, all
    when None) at `rate_scale` under `cost_model`, on the default engine config."""

    workload: str
    max_requests: int | None
    cost_model: str
    rate_scale: float

    def flags(self) -> str:
        """The `metroline compare` flags that replay this case."""
        n = f" --max-requests {self.max_requests}" if self.max_requests is not None else ""
        return f"--workload {self.workload}{n} --cost-model {self.cost_model} --rate-scale {self.rate_scale:g}"

    @property
    def on_trace(self) -> bool:
        return self.workload.startswith(("azure", "mooncake"))


CASES: tuple[Case, ...] = (
    Case("azure-conv", 500, "steps", 1.0),
    Case("azure-conv", 500, "steps", 8.0),
    Case("azure-conv", 500, "roofline", 1.0),
    Case("azure-conv", 500, "roofline", 2.0),
    Case("azure-conv", 500, "roofline", 3.0),
    Case("chat-steady", None, "roofline", 1.0),
    Case("chat", 1000, "roofline", 1.0),
)
"""The cases, in the table's order: the Azure conversation trace at its recorded rate and scaled
up, under both cost models; `compare`'s default workload; `run`'s default, an overload."""


def measure(case: Case) -> dict[str, Any] | None:
    """The load check (`load_check.check`) of one run of `case` on the default engine config."""
    from ...executors.registry import make_executor
    from ..config import EngineConfig
    from ..workloads.build import build_workload
    from .run_series import series_of
    from .runner import run_workload

    config = EngineConfig()
    workload = build_workload(case.workload, max_requests=case.max_requests, rate_scale=case.rate_scale)
    doc, engine = run_workload(workload, config, make_executor("sim", cost_model=case.cost_model))
    return load_check.check([series_of(engine, doc).load], [config.policy])


def _g(x: float) -> str:
    return f"{x:.3g}"


def row(case: Case, found: dict[str, Any] | None) -> str:
    """The table's row of `case` given its check (`measure`)."""
    head = f"| `{case.flags()}` |"
    if found is None:
        return f"{head} - | - | - | - | - | nothing to judge |"
    if found["kind"] == "short":
        e = next(iter(found["runs"].values()))
        return (f"{head} - | - | - | - | - | short: arrivals span {_g(e['span_s'])} s, under "
                f"{load_check.STEADY_SPANS:g} x the mean service time ({_g(e['service_s'])} s) |")
    e = next(iter(found["runs"].values()))
    verdict = "fine" if found["kind"] == "fine" else f"{found['kind']}: `--rate-scale {e['suggested_rate_scale']:g}`"
    return (f"{head} {_g(e['offered_rate_req_s'])} | {_g(e['capacity_req_s'])} | {e['load']:.2f} x | "
            f"{e['binding'].replace('_use', '')} {e['utilisation']:.0%} | {e['queued_share']:.0%} | {verdict} |")


def preamble() -> str:
    """What the table shows, with the check's own thresholds (wrapped at 100 columns)."""
    return textwrap.fill(
        f"What the load check says of some runs (one run of the default engine, policy "
        f"{_default_policy()}, per row: `metroline compare` with these flags prints the same verdict when "
        f"its policies agree). Light: requests waited under {load_check.LIGHT_QUEUED_SHARE:.0%} of the time "
        f"at under {load_check.LIGHT_LOAD:g} x the estimated capacity; heavy: the offered rate is above "
        f"{load_check.HEAVY_LOAD:g} x it (the queue grows for as long as requests arrive); the suggested "
        f"`--rate-scale` offers {load_check.TARGET_LOAD:g} x it; short: arrivals span under "
        f"{load_check.STEADY_SPANS:g} mean service times, not judged. The capacity is estimated from the "
        "run itself (offered rate over the binding resource's use when requests rarely wait, the rate "
        "they were served at when they mostly did), so a suggestion is a first step to rerun, not a "
        "measured capacity: where a step's time grows with the batch (roofline) the light-load estimate "
        "runs high. Generated by `python -m metroline.core.experiments.load_guidance --write`.",
        width=100, break_on_hyphens=False, break_long_words=False,
    )


def _default_policy() -> str:
    from ..config import EngineConfig

    return EngineConfig().policy


HEADER = ("| run | offered (req/s) | capacity (req/s) | load | binding use | requests waiting | the check says |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")


def section(rows: list[str]) -> str:
    """The generated text between the markers."""
    return "\n".join([preamble(), "", HEADER, *rows])


def block(text: str) -> str:
    """The text between the markers of `text` (the document)."""
    if text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(f"{DOCUMENT}: needs exactly one {START} ... {END} block")
    return text.split(START)[1].split(END)[0].strip("\n")


def rewritten(text: str, rows: list[str]) -> str:
    """`text` with the block between its markers replaced by the generated one."""
    block(text)  # the markers are there, once
    head, rest = text.split(START)
    return f"{head}{START}\n{section(rows)}\n{END}{rest.split(END)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m metroline.core.experiments.load_guidance", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"rerun the cases and rewrite {DOCUMENT}'s block")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {DOCUMENT}'s block differs")
    args = parser.parse_args(argv)
    path = Path(__file__).parents[2] / DOCUMENT
    text = path.read_text()
    if args.write or args.check:
        block(text)  # the markers are there, before the runs
    rows = [row(case, measure(case)) for case in CASES]
    if not args.write and not args.check:
        print(section(rows))
        return 0
    new = rewritten(text, rows)
    if args.check and new != text:
        print(f"the load guidance in {DOCUMENT} is out of date: python -m metroline.core.experiments.load_guidance "
              "--write", file=sys.stderr)
        return 1
    if args.write and new != text:
        path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
