"""`session_affinity`: the next turn of a recently active session, whose prefix is cached, boards
ahead of older requests within a window, never past a preempted request nor a head that waited
too long. Orders derived by hand on one slot (`max_num_seqs = 1`, block size 4, 0.01 s a step)."""

from __future__ import annotations

import pytest
from conftest import make_engine, run_to_end, tokens

from metroline.core.plugins.hookspecs import hookimpl
from metroline.plugins_contrib.session_affinity import SessionAffinity

P = tokens(1, 16)  # the first turn's prompt: 4 whole blocks


class Admissions:
    name = "admissions"

    def __init__(self) -> None:
        self.order = []

    @hookimpl
    def on_admitted(self, seqs) -> None:
        self.order.extend(s.request_id for s in seqs)


def req(rid, prompt, arrival, session=None):
    return {"request_id": rid, "prompt_token_ids": prompt, "sampling": {"max_new_tokens": 1},
            "arrival_time": arrival, "metadata": {"session_id": session} if session else {}}


def order(requests, options=None, specs=("session_affinity",)):
    log = Admissions()
    engine = make_engine(plugins=[log], specs=list(specs), max_num_seqs=1,
                         plugin_options={"session_affinity": options or {}} if specs else {})
    for r in requests:
        engine.add_request(r)
    run_to_end(engine)
    return log.order


def two_turns(second_session="s1"):
    """t = 0: A1 (session s1, prompt P) runs alone in step 1 and ends (1 output token), leaving P's
    4 blocks cached and s1 active. t = 0.005: C (8 own tokens, no session) then A2 (P + 4 tokens,
    session s1) arrive; in step 2 the head C has waited 0.005 s."""
    return [req("A1", P, 0.0, "s1"), req("C", tokens(2, 8), 0.005),
            req("A2", P + tokens(3, 4), 0.005, second_session)]


def test_fcfs_alone_serves_in_arrival_order():
    assert order(two_turns(), specs=()) == ["A1", "C", "A2"]


def test_the_warm_turn_of_an_active_session_goes_first():
    assert order(two_turns()) == ["A1", "A2", "C"]


def test_not_for_another_session_nor_past_a_head_that_waited_too_long_nor_without_enough_cache():
    assert order(two_turns(second_session="s2")) == ["A1", "C", "A2"]
    assert order(two_turns(), {"max_head_wait_s": 0.005}) == ["A1", "C", "A2"]  # the head waited 0.005 s
    assert order(two_turns(), {"min_cached_blocks": 5}) == ["A1", "C", "A2"]  # P is 4 blocks
    assert order(two_turns(), {"window": 2}) == ["A1", "A2", "C"]


def test_an_expired_session_is_not_promoted():
    assert order(two_turns(), {"session_ttl_s": 0.005}) == ["A1", "C", "A2"]  # seen at 0.0, step 2 at 0.01


def test_prefix_tokens_name_the_session_of_requests_without_one():
    requests = [req("A1", P, 0.0), req("C", tokens(2, 8), 0.005), req("A2", P + tokens(3, 4), 0.005)]
    assert order(requests) == ["A1", "C", "A2"]
    assert order(requests, {"prefix_tokens": 16}) == ["A1", "A2", "C"]
    assert order(requests, {"prefix_tokens": 17}) == ["A1", "C", "A2"]  # A1's prompt is 16: its 16 tokens differ


def test_options_are_validated():
    with pytest.raises(ValueError, match=r"plugin 'session_affinity': option 'window'.*greater than or equal to 2"):
        SessionAffinity(window=1)
