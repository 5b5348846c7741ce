"""The step protocol of `metroline.core.plugins.hookspecs` holds: every hook call of every step, recorded over
runs with preemption (recompute and swap), parallel sampling, empty steps, an abort, a rescue and
stacked wrappers, follows the order the module docstring lists (`hookspecs.STEP_PROTOCOL`, parsed
from it, so the documentation cannot drift from what the tests check). Wrappers see the same
rules: their answers are checked, their exceptions name them."""

from __future__ import annotations

import re

import pytest
from conftest import make_engine, request

from metroline.core.errors import PluginError
from metroline.core.plugins import hookspecs
from metroline.core.plugins.budget import Split
from metroline.core.plugins.hookspecs import STEP_PROTOCOL, hookimpl
from metroline.plugins_contrib.tenant_shares import TenantShares

NESTED = {"estimate_output_tokens"}  # asked by plugins from their own hooks, outside the protocol


def protocol_regex() -> re.Pattern:
    parts = []
    for hooks, repeat in STEP_PROTOCOL:
        parts.append("(?:" + "|".join(f"{h} " for h in hooks) + ")" + repeat)
    return re.compile("".join(parts))


class Recorder:
    """Every hook call, through the plugin manager's monitor: `(hook, depth)` in order, with a
    marker entry for each step, abort and submission the test makes."""

    def __init__(self, engine) -> None:
        self.log: list[tuple[str, int]] = []
        self.depth = 0
        engine.plugins.monitor(self.before, self.after)

    def before(self, hook, impls, kwargs) -> None:
        self.log.append((hook, self.depth))
        self.depth += 1

    def after(self, outcome, hook, impls, kwargs) -> None:
        self.depth -= 1

    def mark(self, what: str) -> None:
        self.log.append((what.upper(), -1))

    def segments(self) -> list[tuple[str, list[str], list[str]]]:
        """(marker, top-level hooks, nested hooks) per marked action."""
        out: list[tuple[str, list[str], list[str]]] = []
        for hook, depth in self.log:
            if depth < 0:
                out.append((hook, [], []))
            elif depth == 0 and hook not in NESTED:
                out[-1][1].append(hook)
            else:
                out[-1][2].append(hook)
        return out


def drive(engine, recorder, abort_at: int | None = 3, max_steps: int = 2000) -> None:
    steps = 0
    while engine.has_unfinished():
        if steps == abort_at:
            recorder.mark("abort")
            assert engine.abort("r1")  # 13 tokens to generate: still in the engine after 3 steps
        recorder.mark("step")
        engine.step()
        if engine.last_plan_empty:
            engine.idle()
        steps += 1
        assert steps < max_steps


def workload(engine, recorder) -> None:
    """Requests that overload a small pool (preemption), two with parallel samples (forks), and a
    late one (empty steps before it arrives)."""
    recorder.mark("submit")
    for i in range(10):
        n = 3 if i in (2, 5) else 1
        engine.add_request(request(f"r{i}", 10 + 7 * i, max_new=12 + i, n=n, tenant="gold" if i % 3 else "free",
                                   priority=i % 2))
    engine.add_request(request("late", 9, max_new=4, arrival_time=5.0))


class Observer:
    """Implements every observer (so that the engine calls each: one nobody implements is
    skipped), doing nothing."""

    name = "observer"


def _observe(hook: str):
    def impl(self, seqs=None, plan=None):
        return None
    impl.__name__ = hook
    return hookimpl(impl)


for _hook in hookspecs.OBSERVER_HOOKS:
    setattr(Observer, _hook, _observe(_hook))


class PassThrough:
    """A wrapper on every decision hook, new style, that changes nothing."""

    name = "pass_through"


class OldPassThrough:
    """An old-style hookwrapper on every decision hook that changes nothing."""

    name = "old_pass_through"


def _wrap(hook: str, new_style: bool):
    if new_style:
        def impl(self):
            return (yield)
        marker = hookimpl(wrapper=True)
    else:
        def impl(self):
            yield
        marker = hookimpl(hookwrapper=True)
    impl.__name__ = hook
    return marker(impl)


for _hook in hookspecs.DECISION_HOOKS:
    setattr(PassThrough, _hook, _wrap(_hook, True))
    setattr(OldPassThrough, _hook, _wrap(_hook, False))


CASES = {
    "fcfs-recompute": dict(policy="fcfs"),
    "priority-swap": dict(policy="priority", preemption_mode="swap", swap_space_blocks=16),
    "srpt-estimates": dict(policy="srpt"),
    "vllm-no-admission-after-preemption": dict(policy="fcfs", admit_after_preemption=False),
    "wrapped": dict(policy="fcfs", plugins=[PassThrough(), OldPassThrough()]),
    "tenant-shares": dict(policy="fcfs", plugins=[TenantShares({"gold": 0.5})]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_step_calls_the_hooks_in_the_documented_order(case):
    config = dict(CASES[case])
    plugins = config.pop("plugins", [])
    engine = make_engine(plugins=[Observer(), *plugins], num_blocks=24, max_num_seqs=6, max_num_batched_tokens=32, **config)
    recorder = Recorder(engine)
    workload(engine, recorder)
    drive(engine, recorder)
    pattern = protocol_regex()
    seen: set[str] = set()
    kinds = {"STEP": 0, "ABORT": 0, "SUBMIT": 0}
    for marker, hooks, nested in recorder.segments():
        kinds[marker] += 1
        seen.update(hooks)
        if marker == "STEP":
            text = "".join(f"{h} " for h in hooks)
            assert pattern.fullmatch(text), f"step out of the documented order: {hooks}"
        elif marker == "ABORT":
            assert hooks == ["on_finished"]
        else:
            assert set(hooks) <= {"check_request"}
        assert set(nested) <= NESTED | set(hookspecs.DECISION_HOOKS) | set(hookspecs.OBSERVER_HOOKS)
    assert kinds["ABORT"] == 1
    # the runs exercised the protocol: preemption, forks, admission, sampling, the reap
    assert {"select_victim", "on_preempted", "on_admitted", "admission", "sample", "on_finished",
            "on_arrival", "split_budget", "order_running", "on_step_end"} <= seen
    empty = [hooks for marker, hooks, _ in recorder.segments() if marker == "STEP" and "sample" not in hooks]
    assert any(h[-1] == "on_step_end" for h in empty)  # an empty step ends with on_step_end too
    if case == "srpt-estimates":
        assert any("estimate_output_tokens" in nested for _, _, nested in recorder.segments())


def test_a_rescued_step_follows_the_protocol():
    """A policy that refuses everything while a request runs: the core rescues the step."""

    class Stubborn:
        name = "stubborn"

        @hookimpl
        def order_running(self):
            return []

    engine = make_engine(plugins=[Observer(), Stubborn()])
    recorder = Recorder(engine)
    engine.add_request(request("a", 6, max_new=3))
    drive(engine, recorder, abort_at=None)
    assert engine.scheduler.rescues > 0
    pattern = protocol_regex()
    for marker, hooks, _ in recorder.segments():
        if marker == "STEP":
            assert pattern.fullmatch("".join(f"{h} " for h in hooks)), hooks


def test_the_protocol_names_every_step_hook_and_nothing_else():
    listed = {h for hooks, _ in STEP_PROTOCOL for h in hooks}
    step_hooks = set(hookspecs.DECISION_HOOKS) | set(hookspecs.OBSERVER_HOOKS)
    assert listed == step_hooks - NESTED
    assert all(repeat in ("", "?", "*") for _, repeat in STEP_PROTOCOL)
    for name in step_hooks | set(hookspecs.EDGE_HOOKS):
        doc = getattr(hookspecs, name).__doc__
        assert "Called" in doc, f"{name} does not say when it is called"


# --- wrappers see the same rules -------------------------------------------------------------------


class ForcedAdmission:
    """An old-style hookwrapper that forces an admission answer that is not sequences."""

    name = "forced_admission"

    @hookimpl(hookwrapper=True)
    def admission(self):
        outcome = yield
        outcome.force_result(["not a sequence"])


class ForcedSplit:
    """An old-style hookwrapper that forces a split above the budget."""

    name = "forced_split"

    @hookimpl(hookwrapper=True)
    def split_budget(self, budget):
        outcome = yield
        outcome.force_result(Split(budget, budget, 8))


class RaisingOldWrapper:
    name = "raising_old"

    @hookimpl(hookwrapper=True)
    def order_running(self):
        yield
        raise RuntimeError("boom")


def _error(plugin) -> PluginError:
    engine = make_engine(plugins=[plugin])
    for i in range(3):
        engine.add_request(request(f"r{i}", 8))
    with pytest.raises(PluginError) as info:
        drive(engine, Recorder(engine), abort_at=None)
    return info.value


def test_an_answer_an_old_style_wrapper_forced_is_checked_as_its_own():
    err = _error(ForcedAdmission())
    assert (err.plugin, err.hook) == ("forced_admission", "admission")
    assert "not a Sequence" in err.problem


def test_a_forced_answer_checked_against_the_budget_names_the_wrapper():
    err = _error(ForcedSplit())
    assert err.hook == "split_budget" and "forced_split" in err.plugin
    assert "outside the budget" in err.problem


@pytest.mark.filterwarnings("ignore::pluggy.PluggyTeardownRaisedWarning")
def test_an_old_style_wrapper_that_raises_is_named():
    err = _error(RaisingOldWrapper())
    assert (err.plugin, err.hook) == ("raising_old", "order_running")
    assert "wrapper raised RuntimeError: boom" in err.problem
