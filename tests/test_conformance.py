"""Every shipped and contrib plugin passes the conformance suite that plugin authors run."""

import pytest

from metroline.core.plugins.hookspecs import hookimpl
from metroline.testing import ConformanceError, check_plugin, shipped_plugins


@pytest.mark.parametrize("name", shipped_plugins())
def test_shipped_plugin_conforms(name):
    report = check_plugin(name)
    assert len(report.runs) == 6
    assert sum(r["preemptions"] for r in report.runs) > 0  # the suite's small pool forces preemption


class OverBudget:
    name = "over_budget"

    @hookimpl
    def split_budget(self, budget):
        from metroline.core.plugins.budget import Split

        return Split(budget, 1, 16)


class ForgetfulAdmission:
    """Admits the first candidate only, forever: requests behind it are never served."""

    name = "forgetful"

    @hookimpl
    def admission(self, ctx):
        return iter(())


class Chatty:
    """Calls a decision hook once per waiting request per step: unbounded per-step hook calls."""

    name = "chatty"

    @hookimpl
    def on_tokens(self, ctx, seqs):
        for s in seqs:
            ctx.hook.on_step_end(ctx=ctx, plan=None)


def test_suite_catches_a_budget_above_the_total():
    with pytest.raises(ConformanceError, match="over_budget.*split_budget"):
        check_plugin(OverBudget, modes=("recompute",))


def test_suite_catches_lost_requests():
    with pytest.raises(ConformanceError, match="NoProgressError"):
        check_plugin(ForgetfulAdmission, modes=("recompute",))


def test_suite_catches_unbounded_hook_calls():
    with pytest.raises(ConformanceError, match="hook on_step_end called"):
        check_plugin(Chatty, modes=("recompute",))
