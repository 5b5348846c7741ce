"""The output-length estimator plugins (`length_mean`, `length_regression`): their numbers on
small hand-worked examples, the regression recovering a planted line, what they learn from
(completed requests only), their use under a policy of the test's own (an HRRN stacked on fcfs),
their options, and a nonsense estimate being a `PluginError` naming the plugin and the hook."""

from __future__ import annotations

import random

import pytest
from conftest import make_engine, request, run_to_end

from metroline.core.errors import PluginError, PluginLoadError
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import QUEUED, FinishReason, Sequence
from metroline.policies.length_estimators import LengthMean, LengthRegression


def done(tenant: str, prompt: int, output: int, reason: FinishReason = FinishReason.EOS) -> Sequence:
    """A sequence of `tenant` that ended with `output` tokens after a `prompt`-token prompt."""
    s = Sequence(f"{tenant}-{prompt}-{output}", [1] * prompt, SamplingParams(max_new_tokens=10_000), 0.0, tenant=tenant)
    s.token_ids += [3] * output
    s.finish_reason = reason
    return s


def probe(tenant: str, prompt: int = 1) -> Sequence:
    """A new request of `tenant` whose output length is to be estimated."""
    return Sequence("probe", [1] * prompt, SamplingParams(), 0.0, tenant=tenant)


# --- length_mean ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [LengthMean, LengthRegression])
def test_a_prior_of_zero_output_tokens_is_allowed(cls):
    """0 is the least an estimate may be (the hook's contract: an int >= 0): a prior of 0 is
    valid and is the estimate until a request of the tenant completes."""
    est = cls(prior_output_tokens=0)
    assert est.estimate_output_tokens(seq=probe("t")) == 0


def test_length_mean_is_the_rounded_mean_of_the_tenants_completed_requests():
    est = LengthMean(prior_output_tokens=50)
    assert est.estimate_output_tokens(seq=probe("t")) == 50  # nothing completed: the prior
    est.on_finished(seqs=[done("t", 2, 10, FinishReason.LENGTH), done("t", 2, 21, FinishReason.EOS),
                          done("t", 2, 99, FinishReason.CANCELLED), done("u", 2, 7, FinishReason.STOP)])
    assert est.estimate_output_tokens(seq=probe("t")) == 16  # round(31 / 2): 15.5 to the even 16
    assert est.estimate_output_tokens(seq=probe("u")) == 7
    assert est.estimate_output_tokens(seq=probe("v")) == 50  # another tenant's lengths do not count
    est.on_finished(seqs=[done("t", 2, 3)])
    assert est.estimate_output_tokens(seq=probe("t")) == 11  # round(34 / 3) = round(11.33)
    assert est.tenant_stats == {"t": [34, 3], "u": [7, 1]}


def test_estimators_learn_only_from_completed_requests():
    for est in (LengthMean(prior_output_tokens=9), LengthRegression(prior_output_tokens=9, min_samples=2)):
        est.on_finished(seqs=[done("t", 5, 500, reason) for reason in FinishReason
                              if reason not in (FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP)])
        assert est.estimate_output_tokens(seq=probe("t", 5)) == 9


# --- length_regression --------------------------------------------------------------------------------


def test_length_regression_fits_the_least_squares_line_by_hand():
    est = LengthRegression(prior_output_tokens=40, min_samples=3)
    assert est.estimate_output_tokens(seq=probe("t", 4)) == 40  # nothing completed: the prior
    est.on_finished(seqs=[done("t", 1, 1), done("t", 2, 3)])
    # two samples, min_samples 3: the mean round(4 / 2)
    assert est.estimate_output_tokens(seq=probe("t", 100)) == 2
    est.on_finished(seqs=[done("t", 3, 2)])
    # n 3, sum x 6, sum y 6, sum x^2 14, sum xy 13: b = (3*13 - 6*6) / (3*14 - 36) = 3/6 = 1/2,
    # a = (6 - 1/2 * 6) / 3 = 1; so y = 1 + x/2
    assert est.line("t") == (1, 0.5)
    assert est.estimate_output_tokens(seq=probe("t", 4)) == 3
    assert est.estimate_output_tokens(seq=probe("t", 5)) == 4  # 3.5 to the even 4
    assert est.estimate_output_tokens(seq=probe("t", 7)) == 4  # 4.5 to the even 4
    assert est.estimate_output_tokens(seq=probe("t", 40)) == 21
    assert est.estimate_output_tokens(seq=probe("u", 4)) == 40  # the line is the tenant's own


def test_length_regression_without_a_spread_of_prompt_lengths_answers_the_mean():
    est = LengthRegression(min_samples=2)
    est.on_finished(seqs=[done("t", 8, 10), done("t", 8, 20), done("t", 8, 31)])
    assert est.line("t") is None  # every prompt had 8 tokens: no slope to fit
    assert est.estimate_output_tokens(seq=probe("t", 100)) == 20  # round(61 / 3)


def test_length_regression_never_answers_below_zero():
    est = LengthRegression(min_samples=2)
    est.on_finished(seqs=[done("t", 10, 50), done("t", 20, 30)])  # y = 70 - 2x
    assert est.estimate_output_tokens(seq=probe("t", 30)) == 10
    assert est.estimate_output_tokens(seq=probe("t", 100)) == 0  # 70 - 200, clamped


def test_length_regression_recovers_a_planted_line():
    rng = random.Random(7)
    est = LengthRegression()
    # output = 12 + 3 x prompt, plus noise uniform in [-5, 5] (mean 0)
    est.on_finished(seqs=[done("t", x, 12 + 3 * x + rng.randint(-5, 5)) for x in
                          (rng.randint(10, 200) for _ in range(2000))])
    a, b = est.line("t")
    assert abs(b - 3) < 0.02 and abs(a - 12) < 2
    for x in (10, 50, 150, 300):
        assert abs(est.estimate_output_tokens(seq=probe("t", x)) - (12 + 3 * x)) <= 3


@pytest.mark.parametrize(
    ("cls", "options", "match"),
    [
        (LengthMean, {"prior_output_tokens": -1},
         r"plugin 'length_mean': option 'prior_output_tokens': .*greater than or equal to 0 \(got -1\)"),
        (LengthMean, {"prior_output_tokens": 2.5},
         r"plugin 'length_mean': option 'prior_output_tokens': .*integer.*\(got 2.5\)"),
        (LengthRegression, {"min_samples": 1},
         r"plugin 'length_regression': option 'min_samples': .*greater than or equal to 2 \(got 1\)"),
        (LengthRegression, {"min_samples": True},
         r"plugin 'length_regression': option 'min_samples': .*integer.*\(got True\)"),
    ],
)
def test_bad_options_are_refused(cls, options, match):
    with pytest.raises(ValueError, match=match):
        cls(**options)


# --- under a policy of one's own ----------------------------------------------------------------------


class HRRN:
    """Highest response ratio next, `(wait + expected output) / expected output`: a research
    policy that asks the `estimate_output_tokens` hook for each request when it arrives and keeps
    every answer in `estimates`."""

    name = "hrrn"

    def __init__(self) -> None:
        self.estimates: dict[str, int] = {}

    @hookimpl
    def on_arrival(self, ctx, seqs):
        for s in seqs:
            est = ctx.hook.estimate_output_tokens(ctx=ctx, seq=s)
            assert est is not None, "no estimator answered"
            self.estimates[s.seq_id] = est

    @hookimpl
    def admission(self, ctx):
        def ratio(s):
            service = max(1, self.estimates[s.seq_id])
            return -(ctx.now - s.arrival_time + service) / service, s.arrival_time, s.arrival_no

        return sorted((s for s in ctx.waiting if s.state in QUEUED), key=ratio)


def test_an_hrrn_policy_gets_length_regression_estimates_on_fcfs():
    hrrn = HRRN()
    engine = make_engine(policy="fcfs", specs=["length_regression"], plugins=[hrrn], max_num_seqs=1,
                         max_num_batched_tokens=256, num_blocks=256)
    # planted: output = 3 + 2 x prompt; 8 requests (min_samples) teach the line
    for i, prompt in enumerate((4, 6, 9, 12, 15, 20, 25, 30)):
        engine.add_request(request(f"train{i}", prompt, max_new=3 + 2 * prompt, ignore_eos=True))
    run_to_end(engine)
    # they all arrived before anything completed: the prior
    assert {hrrn.estimates[f"train{i}"] for i in range(8)} == {128}
    t = engine.executor.now()
    for prompt in (40, 5, 17):
        engine.add_request(request(f"p{prompt}", prompt, max_new=200, ignore_eos=True, arrival_time=t))
    engine.executor.idle_until(t + 1.0)  # each has waited 1 s at the first admission
    engine.step()
    assert [hrrn.estimates[f"p{p}"] for p in (40, 5, 17)] == [83, 13, 37]
    run_to_end(engine)
    # the same wait, so the ratio (1 + estimate) / estimate is highest for the shortest estimate
    admitted = [sid for p in engine.executor.plans for sid in p.admitted]
    assert admitted[-3:] == ["p5", "p17", "p40"]


def test_the_estimators_are_selected_by_name():
    for name, cls in (("length_mean", LengthMean), ("length_regression", LengthRegression)):
        engine = make_engine(policy="srpt", specs=[name], plugin_options={name: {"prior_output_tokens": 5}})
        est = engine.plugins.get(name)
        assert isinstance(est, cls) and est.prior_output_tokens == 5


def test_an_estimators_bad_option_is_a_load_error_naming_it():
    with pytest.raises(PluginLoadError, match="length_regression.*min_samples"):
        make_engine(specs=["length_regression"], plugin_options={"length_regression": {"min_samples": 0}})


# --- nonsense estimates ---------------------------------------------------------------------------------


class Nonsense:
    """An estimator whose answer is `answer`, whatever the request."""

    name = "nonsense"

    def __init__(self, answer) -> None:
        self.answer = answer

    @hookimpl
    def estimate_output_tokens(self, seq):
        return self.answer


@pytest.mark.parametrize("answer", [-3, 2.5, "12", True, [4]])
@pytest.mark.parametrize("policy", ["srpt", "hrrn"])
def test_a_nonsense_estimate_is_a_plugin_error_naming_the_estimator(answer, policy):
    # a sound estimator below the nonsense one: the first answer, the nonsense, is the one checked
    plugins = [LengthMean(), Nonsense(answer)] if policy == "srpt" else [LengthMean(), HRRN(), Nonsense(answer)]
    engine = make_engine(policy="srpt" if policy == "srpt" else "fcfs", plugins=plugins)
    engine.add_request(request("r", 4))
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("nonsense", "estimate_output_tokens")
    assert "expected an int >= 0" in info.value.problem


def test_metroline_plugins_lists_an_estimator_stacked_by_name(capsys):
    from metroline import cli

    assert cli.main(["plugins", "--policy", "srpt", "--plugin", "length_regression"]) == 0
    out = capsys.readouterr().out
    assert "length_regression" in out.split("shipped:")[0]  # loaded, with its hooks
    assert "estimate_output_tokens, on_finished" in out
