"""`adaptive_speculation`: fewer drafts as the batch grows and as a request's drafts fail; it
passes the conformance suite (under speculation) and beats a fixed k on P99 TPOT at high load is
measured in bench/, not here."""

from __future__ import annotations

import pytest

from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import Sequence
from metroline.policies.speculation import AdaptiveSpeculation, default_table
from metroline.testing import check_plugin


def _seq(drafted: int, accepted: int) -> Sequence:
    s = Sequence("r", [1, 2], SamplingParams(max_new_tokens=50), 0.0)
    s.num_draft_tokens, s.num_accepted_tokens = drafted, accepted
    return s


def test_the_batch_table_caps_the_drafts():
    p = AdaptiveSpeculation()
    assert default_table(5) == [[1, 5], [8, 3], [32, 1], [64, 0]]
    assert [p.drafts_for_batch(b, 5) for b in (1, 7, 8, 31, 32, 63, 64, 500)] == [5, 5, 3, 3, 1, 1, 0, 0]
    custom = AdaptiveSpeculation(by_batch_size=[[1, 2], [4, 9]])
    assert [custom.drafts_for_batch(b, 6) for b in (1, 3, 4)] == [2, 2, 6]  # never above max_drafts
    assert p.num_draft_tokens(decodes=[_seq(0, 0)] * 70, max_drafts=5) == [0] * 70


def test_a_request_gets_the_drafts_its_acceptance_earns():
    p = AdaptiveSpeculation(min_gain=0.25, prior=0.0, prior_rate=0.5)
    # acceptance a: draft j while a ** j >= 0.25
    assert p.drafts_for(_seq(100, 90), 8) == 8  # 0.9 ** 13 >= 0.25: capped at 8
    assert p.drafts_for(_seq(100, 50), 8) == 2  # 0.5 ** 2 = 0.25
    assert p.drafts_for(_seq(100, 20), 8) == 0  # 0.2 < 0.25
    fresh = AdaptiveSpeculation(prior=4.0, prior_rate=0.7)
    assert fresh.drafts_for(_seq(0, 0), 8) == 3  # 0.7 ** 3 = 0.343, 0.7 ** 4 = 0.24


@pytest.mark.parametrize("rows", [[], [[4, 1], [2, 1]], [[0, 1]], [[1, -1]], [[1, 2, 3]]])
def test_a_bad_table_is_refused_naming_it(rows):
    with pytest.raises(Exception, match="by_batch_size"):
        AdaptiveSpeculation(by_batch_size=rows)


def test_adaptive_speculation_passes_the_conformance_suite():
    report = check_plugin("adaptive_speculation", modes=("recompute",))
    cov = report.coverage["num_draft_tokens"]
    assert cov.calls > 0 and cov.changed > 0
