"""`adaptive_speculation`: per request and step, the drafts that minimise the step's seconds per
token (a power mean over its decodes) under the cost model; it passes the conformance suite
(under speculation). How it compares with every fixed k on P99 TPOT at high load is measured in
bench/ (`bench/spec_study.py`, `bench/spec_arms.toml`; docs/guide/speculative-decoding.md: from a cold
start, within capacity and past it, `--warmup-s`), not here."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from metroline.core.config import EngineConfig
from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import Sequence
from metroline.policies.speculation import HISTORY_PRIOR_TOKENS, AdaptiveSpeculation, choose_drafts
from metroline.testing import check_plugin


def _seq(accepted: int = 0, rejections: int = 0, context: int = 8, rid: str = "r") -> Sequence:
    s = Sequence(rid, list(range(1, context + 1)), SamplingParams(max_new_tokens=50), 0.0)
    s.token_ids.append(7)  # one output token: a decode, its newest token without KV
    s.num_computed_tokens = context
    s.num_accepted_tokens, s.num_draft_rejections = accepted, rejections
    return s


def _expected(a: float, k: int) -> float:
    """Expected tokens of `k` drafts at per-draft acceptance `a`, the closed form."""
    return k + 1.0 if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def _objective(rates, counts, costs, power, weights=None):
    """The step's seconds x the power mean's sum of w_i (1 / E_i) ** power, as choose_drafts defines it."""
    n, b = sum(counts), len(rates)
    w = weights or [1.0] * b
    whole, part = divmod(n, b)
    seconds = costs[whole] + ((costs[whole + 1] - costs[whole]) * part / b if part else 0.0)
    return seconds * sum(wi * _expected(a, k) ** -power for wi, a, k in zip(w, rates, counts)) ** (1 / power)


def test_the_acceptance_estimate_counts_rejections_not_untested_drafts():
    p = AdaptiveSpeculation(prior=0.0)
    # 30 accepted, 10 runs ended at a rejection: a = 30 / 40, whatever was drafted after the rejections
    assert p.rate(_seq(30, 10)) == pytest.approx(0.75)
    fresh = AdaptiveSpeculation(prior=4.0, prior_rate=0.7)
    assert fresh.rate(_seq()) == pytest.approx(0.7)
    assert fresh.rate(_seq(6, 2)) == pytest.approx((6 + 2.8) / (8 + 4))


def test_free_drafts_go_to_every_request_that_may_accept_one():
    """A weights-bound step (the same seconds whatever the drafts) and no draft model: every
    draft with a chance of acceptance cuts the seconds per token; one that is never accepted does not."""
    assert choose_drafts([0.0, 0.5, 0.9], 4, [1.0] * 5, 0.0, 2.0) == [0, 4, 4]


@pytest.mark.parametrize("power", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("rates", [(0.2, 0.6, 0.9), (0.5, 0.5), (0.05, 0.95, 0.7)])
@pytest.mark.parametrize("costs", [
    [10.0, 10.0, 11.0, 14.0],  # weights-bound, then compute-bound: a convex cost
    [10.0, 12.0, 14.0, 16.0],  # compute-bound from the first draft
    [10.0, 30.0, 50.0, 70.0],  # drafts as dear as the whole step
])
def test_the_chosen_drafts_are_the_best_of_every_allocation(power, rates, costs):
    chosen = choose_drafts(list(rates), 3, costs, 0.0, power)
    best = min(_objective(rates, c, costs, power) for c in itertools.product(range(4), repeat=len(rates)))
    assert _objective(rates, chosen, costs, power) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0), (3.0, 1.0, 0.5), (0.2, 0.2, 5.0)])
@pytest.mark.parametrize("rates", [(0.2, 0.6, 0.9), (0.5, 0.5, 0.5)])
def test_the_weighted_drafts_are_the_best_of_every_allocation(weights, rates):
    costs = [10.0, 10.0, 11.0, 14.0]
    chosen = choose_drafts(list(rates), 3, costs, 0.0, 2.0, list(weights))
    best = min(_objective(rates, c, costs, 2.0, weights) for c in itertools.product(range(4), repeat=3))
    assert _objective(rates, chosen, costs, 2.0, weights) == pytest.approx(best, rel=1e-12)


def test_a_slow_requests_weight_moves_the_one_draft_worth_taking_to_it():
    """Acceptances 0.2 and 0.8, one draft each at most, power 1; a draft per decode adds 1.5 s to
    a 10 s step. Unweighted: no draft is 10 x 2 = 20; the 0.8 decode's (its cut 1 - 1/1.8 the
    larger) 11.5 x (2 - 0.444) = 17.9; both 13 x (1/1.2 + 1/1.8) = 18.1: only the 0.8 decode
    drafts. The 0.2 decode weighing 4 (it has been four times as slow): none 10 x 5 = 50; its
    draft first (4 x (1 - 1/1.2) = 0.667 against 0.444) 11.5 x 4.333 = 49.8; both 13 x 3.889 =
    50.6: only the slow decode drafts."""
    costs = [10.0, 13.0]
    assert choose_drafts([0.2, 0.8], 1, costs, 0.0, 1.0) == [0, 1]
    assert choose_drafts([0.2, 0.8], 1, costs, 0.0, 1.0, [4.0, 1.0]) == [1, 0]
    assert choose_drafts([0.2, 0.8], 1, costs, 0.0, 1.0, [1.0, 1.0]) == [0, 1]


def _decoding_since(first_token: float, outputs: int, rid: str) -> Sequence:
    s = _seq(rid=rid)
    s.token_ids.extend([7] * (outputs - 1))
    s.num_computed_tokens = len(s.token_ids) - 1
    s.first_token_time = first_token
    return s


def test_each_decodes_weight_is_its_seconds_per_token_so_far_over_the_batchs_mean():
    """At 1 s, with the step at 0.02 s and 2 prior tokens: a decode since 0 s with 11 output tokens
    spent (1 + 2 x 0.02) / (10 + 2) = 0.0867 s a token; a new decode (its first token only) counts
    as the step, (0 + 0.04) / 2 = 0.02; one since 0.5 s with 51 tokens (0.5 + 0.04) / 52."""
    assert HISTORY_PRIOR_TOKENS == 2
    decodes = [_decoding_since(0.0, 11, "slow"), _decoding_since(1.0, 1, "new"), _decoding_since(0.5, 51, "fast")]
    times = [1.04 / 12, 0.04 / 2, 0.54 / 52]
    mean = sum(times) / 3
    for q in (1.0, 2.0):
        got = AdaptiveSpeculation(tail_weight=q).weights(1.0, decodes, 0.02)
        assert got == pytest.approx([(t / mean) ** q for t in times], rel=1e-12)
    assert AdaptiveSpeculation(tail_weight=0.0).weights(1.0, decodes, 0.02) == [1.0, 1.0, 1.0]


def test_the_slowest_request_so_far_gets_the_drafts_the_step_can_afford():
    """64 decodes at the same measured acceptance (30 accepted, 30 rejections: 0.51 with the prior)
    in a compute-bound step of the roofline model: with every decode alike (`tail_weight` 0) they
    all get the same drafts; when one of them has spent ten times the others' seconds per token so
    far, it gets at least as many as any other, and more than the least served."""
    decodes = [_decoding_since(0.0, 101, f"r{i}") for i in range(64)]
    for s in decodes:
        s.num_accepted_tokens, s.num_draft_rejections = 30, 30
    slow = decodes[5]
    slow.token_ids[slow.num_prompt_tokens + 11:] = []  # 11 output tokens in the same time: 10x slower
    slow.num_computed_tokens = len(slow.token_ids) - 1
    ctx = _ctx(decodes, max_num_seqs=64)
    ctx.now = 2.0
    alike = AdaptiveSpeculation(tail_weight=0.0).num_draft_tokens(ctx=ctx, decodes=decodes, max_drafts=4)
    assert len(set(alike[:5] + alike[6:])) == 1 and alike[5] == alike[0]
    weighted = AdaptiveSpeculation(tail_weight=1.0).num_draft_tokens(ctx=ctx, decodes=decodes, max_drafts=4)
    assert weighted[5] == max(weighted) and weighted[5] > min(weighted)


def test_a_higher_tail_power_favours_the_low_acceptance_decodes():
    """Power 1 minimises the mean seconds per token; a larger power weighs the slowest decode
    (the low-acceptance one) more, so it never gets fewer drafts, and the others never more."""
    rates, costs = [0.3, 0.9, 0.9, 0.9], [10.0, 11.0, 12.0, 13.0, 14.0]
    mean, tail = choose_drafts(rates, 4, costs, 0.0, 1.0), choose_drafts(rates, 4, costs, 0.0, 8.0)
    assert tail[0] >= mean[0] and all(t <= m for t, m in zip(tail[1:], mean[1:]))
    assert tail != mean


def test_a_draft_models_forward_is_paid_per_draft_position():
    rates, costs = [0.6] * 4, [10.0] * 4
    assert choose_drafts(rates, 3, costs, 0.0, 2.0) == [3] * 4
    # a forward as dear as the step: each position must more than double the tokens per step, which none does
    assert choose_drafts(rates, 3, costs, 10.0, 2.0) == [0] * 4


def _ctx(decodes, waiting=(), spec=None, **config):
    config = EngineConfig(speculative_config=spec or {"method": "draft_model", "model": "d", "num_speculative_tokens": 4,
                                                      "draft_cost": 0.0}, **config)
    return SimpleNamespace(config=config, block_size=config.block_size, running=list(decodes), waiting=list(waiting),
                           now=0.0)


def test_drafts_fall_as_the_batch_grows_on_the_roofline_model():
    """llama-3-8b on an A100: a batch of 1 is bound by reading the weights (drafts ride free); at
    hundreds of decodes the step is bound by compute and every draft costs a token's compute."""
    p = AdaptiveSpeculation()
    per_decode = []
    for batch in (1, 16, 64, 256, 512):
        decodes = [_seq(30, 10, context=500, rid=f"r{i}") for i in range(batch)]
        per_decode.append(sum(p.num_draft_tokens(ctx=_ctx(decodes, max_num_seqs=1024), decodes=decodes,
                                                 max_drafts=4)) / batch)
    assert per_decode[0] == 4
    assert all(a >= b for a, b in zip(per_decode, per_decode[1:]))
    assert per_decode[-1] < 1


def test_a_waiting_prefill_that_makes_the_step_compute_bound_cuts_the_drafts():
    """64 decodes alone are bound by reading the weights up to about two drafts each; an 800-token
    prompt waiting for a seat makes the step bound by compute, where every draft costs a token's
    compute: at acceptances up to about 0.6, never more drafts and fewer at some (at a high one,
    once the drafts cost compute anyway, the tokens they add may pay for more); without a seat for
    the prompt, the same drafts."""
    p = AdaptiveSpeculation()
    prompt = Sequence("w", list(range(1, 801)), SamplingParams(max_new_tokens=5), 0.0)
    fewer = 0
    for accepted in range(0, 35, 5):  # a = (accepted + 2.8) / 54: 0.05 to 0.6
        decodes = [_seq(accepted, 50 - accepted, context=500, rid=f"r{i}") for i in range(64)]
        alone = p.num_draft_tokens(ctx=_ctx(decodes, max_num_seqs=256), decodes=decodes, max_drafts=4)
        with_prefill = p.num_draft_tokens(ctx=_ctx(decodes, [prompt], max_num_seqs=256), decodes=decodes, max_drafts=4)
        assert sum(with_prefill) <= sum(alone)
        fewer += sum(with_prefill) < sum(alone)
        no_seat = _ctx(decodes, [prompt], max_num_seqs=64)
        assert p.num_draft_tokens(ctx=no_seat, decodes=decodes, max_drafts=4) == alone
    assert fewer > 0


def test_the_batch_table_caps_the_drafts():
    p = AdaptiveSpeculation(by_batch_size=[[1, 5], [8, 3], [32, 1], [64, 0]])
    assert [p.drafts_for_batch(b, 5) for b in (1, 7, 8, 31, 32, 63, 64, 500)] == [5, 5, 3, 3, 1, 1, 0, 0]
    custom = AdaptiveSpeculation(by_batch_size=[[1, 2], [4, 9]])
    assert [custom.drafts_for_batch(b, 6) for b in (1, 3, 4)] == [2, 2, 6]  # never above max_drafts
    assert AdaptiveSpeculation().drafts_for_batch(500, 5) == 5  # no table: the cost model alone decides
    decodes = [_seq(rid=f"r{i}") for i in range(70)]
    assert p.num_draft_tokens(ctx=_ctx(decodes), decodes=decodes, max_drafts=5) == [0] * 70


@pytest.mark.parametrize("rows", [[], [[4, 1], [2, 1]], [[0, 1]], [[1, -1]], [[1, 2, 3]]])
def test_a_bad_table_is_refused_naming_it(rows):
    with pytest.raises(Exception, match="by_batch_size"):
        AdaptiveSpeculation(by_batch_size=rows)


def test_a_bad_cost_model_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="adaptive_speculation.cost_model"):
        AdaptiveSpeculation(cost_model="nonesuch")


def test_adaptive_speculation_passes_the_conformance_suite():
    report = check_plugin("adaptive_speculation", modes=("recompute",))
    cov = report.coverage["num_draft_tokens"]
    assert cov.calls > 0 and cov.changed > 0
