"""`metroline compare --aa POLICY`: the two arms of an A/A check, alike but for the salt of
their plugins' private randomness (`StepContext.salt`)."""

from __future__ import annotations

import argparse
from typing import Any


def aa_configs(args: argparse.Namespace, config: Any) -> tuple[list[str], list[Any]]:
    """The two arms of `--aa POLICY` (labels and configs, alike but for `plugin_salt`), after checking its flags."""
    if args.policies is not None or args.routers is not None or args.baseline is not None:
        raise ValueError("--aa: compares one policy with itself; give it without --policies, --routers or --baseline")
    if args.seeds is None:
        raise ValueError("--aa: give --seeds K (each A/A table pairs K draws)")
    if args.trials < 1:
        raise ValueError(f"--trials: must be at least 1, got {args.trials}")
    if args.report:
        raise ValueError("--report: an A/A check prints its false-verdict rates (--json keeps its tables); no report")
    from .arms import policy_configs

    _, (arm,) = policy_configs(args.aa, config)
    return [f"{args.aa} (a)", f"{args.aa} (b)"], [arm, arm]


def aa_runs(runs: list[tuple[Any, Any, Any]], k: int) -> list[tuple[Any, Any, Any]]:
    """`runs` (table by table, draw by draw, arm by arm) with each arm's own salt (`aa.aa_salts`)."""
    from ..results.aa import aa_salts

    out = []
    for j, (w, c, sp) in enumerate(runs):
        draw, arm = divmod(j, 2)
        out.append((w, c.model_copy(update={"plugin_salt": aa_salts(*divmod(draw, k), k)[arm]}), sp))
    return out
