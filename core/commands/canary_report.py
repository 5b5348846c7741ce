"""`metroline canary-report SOURCE`: each canary's arms compared (TTFT and TPOT percentiles with
intervals and a verdict, `results/canary.py`), from a serving front (`http://HOST:PORT`, its
`/v1/canary`) or a file: a simulated run's result document (`run --json` with a canary in its
`[cluster]`) or a saved `/v1/canary` answer."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def canary_source(source: str, timeout: float = 30.0) -> dict[str, Any]:
    """The JSON of `source`: a front's `/v1/canary` (a URL) or a file."""
    if source.startswith(("http://", "https://")):
        url = source.rstrip("/")
        if not url.endswith("/v1/canary"):
            url += "/v1/canary"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - the user's URL
                return json.loads(answer.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ValueError(f"canary-report: {url}: {getattr(exc, 'reason', exc)}") from None
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"canary-report: {source}: no such file (give a result document, a saved /v1/canary "
                         "answer or http://HOST:PORT)")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"canary-report: {source}: not JSON ({exc})") from None


def canary_comparisons(data: dict[str, Any], *, level: float = 0.95) -> dict[str, dict[str, Any]]:
    """pool -> {"policy": {arm: stack}, "comparison": ...} of a result document (its `canary`
    section, compared again at `level`) or of a `/v1/canary` answer (its per-arm rows)."""
    from ..results.canary import compare_arms, samples_of_rows

    pools = data.get("canary")
    if pools is None:
        pools = data.get("pools") if "pools" in data and data.get("kind") == "metroline.canary" else None
    if not isinstance(pools, dict) or not pools:
        raise ValueError("canary-report: no canary in it (a run's `[cluster]` pool needs a `canary` table; a "
                         "serving front one too)")
    out = {}
    for pool, entry in pools.items():
        rows = entry.get("rows")
        if rows is not None:
            comparison = compare_arms(samples_of_rows(rows["baseline"]), samples_of_rows(rows["canary"]), level=level)
        elif level != entry["comparison"]["level"]:
            raise ValueError("canary-report: --level: a result document holds its comparison at "
                             f"{entry['comparison']['level']}; rerun with a serving front's rows to change it")
        else:
            comparison = entry["comparison"]
        out[pool] = {"policy": entry.get("policy", {}), "changes": entry.get("changes", {}), "comparison": comparison}
    return out


def canary_name(pool: str, entry: dict[str, Any]) -> str:
    """`pool (baseline stack -> canary stack; field a -> b, ...)`: what differs between the arms."""
    policy = entry.get("policy") or {}
    changes = "".join(f"; {k} {a} -> {b}" for k, (a, b) in (entry.get("changes") or {}).items())
    return f"{pool} ({policy.get('baseline', '?')} -> {policy.get('canary', '?')}{changes})"


def cmd_canary_report(args: argparse.Namespace) -> int:
    """Print each canary's comparison; `--json` writes them. Exit 0 (1 with `--fail-on-worse` when
    a canary is worse)."""
    from ..results.canary import format_canary
    from ..results.files import write_json

    if not 0 < args.level < 1:
        raise ValueError(f"--level: must be between 0 and 1, got {args.level}")
    comparisons = canary_comparisons(canary_source(args.source), level=args.level)
    for pool, entry in comparisons.items():
        print(format_canary(canary_name(pool, entry), entry["comparison"]), end="")
    if args.json:
        write_json(args.json, {"canary": comparisons})
    worse = any(e["comparison"]["verdict"] == "worse" for e in comparisons.values())
    return 1 if worse and args.fail_on_worse else 0
