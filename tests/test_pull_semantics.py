"""The plugin guide's pull-semantics table (docs/plugins.md, "Pull semantics"): an `admission`
wrapper that pulls one candidate ahead of the core changes nothing under the policies whose
candidates are fixed when the step starts, and changes whom `weighted_fair` admits (it picks each
candidate when pulled, from the admissions made before). The same wrapper written with
`Candidates.filter` (judging each candidate as it is pulled) changes nothing under any of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from metroline.api import Candidates, hookimpl
from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.workloads.build import SyntheticSpec, Workload, generate
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

GUIDE = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()


class OneAhead:
    """Passes the policy's candidates on unchanged, but pulls each one before handing on the one
    before it (as a wrapper that peeks at the next candidate would)."""

    name = "one_ahead"

    @hookimpl(wrapper=True)
    def admission(self, ctx):
        cands = Candidates.of((yield))

        def ahead():
            it = iter(cands)
            before = next(it, None)
            for seq in it:
                yield before
                before = seq
            if before is not None:
                yield before

        return Candidates(ahead(), cands.head_of_line)


class PassThrough:
    """The same wrapper as `filter` writes it: each candidate judged (kept) as it is pulled."""

    name = "pass_through"

    @hookimpl(wrapper=True)
    def admission(self, ctx):
        return Candidates.of((yield)).filter(lambda s: True)


WORKLOAD = Workload("three-tenants", generate(SyntheticSpec(
    num_requests=120, rate=40.0, prompt_len=64, output_len=24, tenants={"a": 0.5, "b": 0.3, "c": 0.2}, seed=5)), "", {})


def first_tokens(policy: str, plugin=None) -> list[tuple[str, float]]:
    config = EngineConfig(policy=policy, max_num_seqs=6, max_num_batched_tokens=256)
    doc, engine = run_workload(WORKLOAD, config, SimulatedExecutor(make_cost_model("steps")),
                               plugins=[plugin] if plugin is not None else None)
    assert doc["summary"]["completed"] == 120
    return sorted((r.id, r.first_token_s) for r in engine.metrics.requests)


def policies_in_the_guide() -> dict[str, bool]:
    """Each policy of the guide's table, and whether the table says pulling ahead changes it."""
    section = GUIDE.split("### Pull semantics", 1)[1].split("\n#", 1)[0]
    out = {}
    for row in re.findall(r"^\| (`.*?) \| .*? \| (.*?) \|$", section, re.M):
        for name in re.findall(r"`(\w+)`", row[0]):
            out[name] = row[1].startswith("**changes")
    return out


def test_the_guide_lists_every_shipped_ordering_policy():
    assert policies_in_the_guide() == {"fcfs": False, "priority": False, "token_rr": False, "srpt": False,
                                       "static": False, "weighted_fair": True}


@pytest.mark.parametrize("policy, changes", sorted(policies_in_the_guide().items()))
def test_pulling_one_ahead_changes_only_the_policies_the_guide_says(policy, changes):
    alone = first_tokens(policy)
    assert (first_tokens(policy, OneAhead()) != alone) == changes
    assert first_tokens(policy, PassThrough()) == alone
