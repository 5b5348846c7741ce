"""The load check's speculation warning (`load_check.speculation_message`): a run with speculative
decoding warns when its drafts take the token budget from prompts while requests wait (the default
`chat-steady` load, n-gram k = 4: TTFT grows several times), and not at a light load, nor with
`adaptive_speculation` sizing the drafts to the budget left."""

from __future__ import annotations

import json

import pytest

from metroline import cli
from metroline.core.experiments.load_check import LIGHT_QUEUED_SHARE, SPECULATION_TOKEN_USE, speculation_message

SPEC = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']
RUN = ["run", "--workload", "chat-steady", "--max-requests", "500", "--no-progress"]


def run(capsys, tmp_path, *argv: str) -> tuple[dict, list[str]]:
    out = tmp_path / "out.json"
    assert cli.main([*RUN, *argv, "--json", str(out)]) == 0
    err = capsys.readouterr().err
    return json.loads(out.read_text()), [ln for ln in err.splitlines() if "speculation" in ln]


def test_speculation_on_the_default_load_warns_and_adaptive_drafts_do_not(capsys, tmp_path):
    plain, none = run(capsys, tmp_path)
    assert none == []  # no speculation, no warning
    spec, (warning,) = run(capsys, tmp_path, *SPEC)
    s = spec["summary"]
    assert s["ttft_s"]["mean"] > 3 * plain["summary"]["ttft_s"]["mean"]  # what the warning is about
    assert warning.startswith("metroline: warning: speculation spends the prefill share at this load: the token "
                              "budget binds (")
    assert (f"({s['acceptance_rate']:.0%} of drafts accepted, {s['draft_tokens_thrown_away']:,} draft tokens thrown "
            f"away; mean TTFT {s['ttft_s']['mean'] * 1000:.0f} ms); --plugin adaptive_speculation") in warning
    adaptive, quiet = run(capsys, tmp_path, *SPEC, "--plugin", "adaptive_speculation")
    assert quiet == []
    assert adaptive["summary"]["ttft_s"]["mean"] < s["ttft_s"]["mean"] / 3


def test_speculation_at_a_light_load_does_not_warn(capsys, tmp_path):
    doc, lines = run(capsys, tmp_path, *SPEC, "--rate-scale", "0.2")
    assert lines == [] and doc["summary"]["acceptance_rate"] > 0


def test_compare_names_the_policy_whose_drafts_cost_ttft(capsys):
    assert cli.main(["compare", "--policies", "fcfs,srpt", "--workload", "chat-steady", "--max-requests", "500",
                     "--no-progress", "--jobs", "1", *SPEC]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "speculation" in ln]
    assert [ln.split(": ")[2] for ln in lines] == ["fcfs", "srpt"]


STATS = {"binding": "token_use", "token_use": 0.9, "queued_share": 0.5}
SUMMARY = {"acceptance_rate": 0.5, "draft_tokens_thrown_away": 1234, "ttft_s": {"mean": 2.0}}


@pytest.mark.parametrize("stats, warns", [
    (STATS, True),
    ({**STATS, "binding": "slot_use"}, False),  # the token budget is not what binds: drafts take no prompt's place
    ({**STATS, "queued_share": LIGHT_QUEUED_SHARE - 0.001}, False),  # nobody waits
    ({**STATS, "queued_share": LIGHT_QUEUED_SHARE}, True),
    ({**STATS, "token_use": SPECULATION_TOKEN_USE - 0.001}, False),  # budget left for prompts
    ({**STATS, "token_use": SPECULATION_TOKEN_USE}, True),
    ({}, False),
])
def test_the_rule(stats, warns):
    message = speculation_message(stats, SUMMARY, "srpt")
    assert (message is not None) == warns
    if warns:
        assert message.startswith("warning: srpt: speculation spends the prefill share")
        assert "(50% of drafts accepted, 1,234 draft tokens thrown away; mean TTFT 2000 ms)" in message


def test_with_adaptive_drafts_it_suggests_fewer_tokens():
    assert speculation_message(STATS, SUMMARY, adaptive=True).endswith(
        "lower num_speculative_tokens, or compare without --speculative-config")
