"""Metrics collection, summaries, and the reports built from them, on hand-made runs."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import FinishReason, SeqState, Sequence
from metroline.core.results.files import write_json, write_requests_csv, write_steps_csv
from metroline.core.results.metrics import (
    LATENCY_FIELDS,
    SUMMARY_KEYS,
    MetricsCollector,
    StepRow,
    distribution,
    percentile,
    result_document,
    summarize,
    summarize_by_priority,
    summarize_by_tenant,
)
from metroline.core.results.report import format_comparison_table, format_summary_table, print_summary_table
from metroline.core.step.plan import StepPlan

MAX_NUM_SEQS = 4


def make_seq(
    seq_id, tenant, arrival, *, prompt=4, scheduled=None, first_token=None, token_times=(), finish=None,
    reason=FinishReason.EOS, cached=0, preemptions=0, recomputed=0,
) -> Sequence:
    seq = Sequence(seq_id, list(range(prompt)), SamplingParams(), arrival, tenant=tenant)
    seq.token_ids.extend(range(100, 100 + len(token_times)))
    seq.num_computed_tokens = len(seq.token_ids)
    seq.first_scheduled_time = scheduled
    seq.prefill_done_time = first_token
    seq.first_token_time = first_token
    seq.token_times = list(token_times)
    seq.finish_time = finish
    seq.finish_reason = reason
    seq.state = SeqState.FINISHED
    seq.num_cached_prompt_tokens = cached
    seq.num_preemptions = preemptions
    seq.recomputed_tokens = recomputed
    return seq


def make_plan(step, seqs, prefill, decode, preempted=()) -> StepPlan:
    plan = StepPlan(step, 16)
    plan.scheduled = {s: 1 for s in seqs}
    plan.num_prefill_tokens = prefill
    plan.num_decode_tokens = decode
    plan.preempted = list(preempted)
    return plan


@pytest.fixture
def collector() -> MetricsCollector:
    """Three completed sequences, one cancelled, one rejected; two tenants; four steps.

    alice/a: ttft 1.0, tpot 0.75, gaps 0.5 and 1.0, e2e 2.5, queue 0.5
    bob/b:   ttft 2.0, tpot 0.25, gap 0.25,         e2e 2.25, queue 0.0
    alice/c: ttft 2.0, one token,                   e2e 2.0, queue 0.0
    bob/d:   cancelled after one token (counts for tokens and hit rate, not latencies)
    alice/e: rejected
    """
    a = make_seq("a", "alice", 0.0, scheduled=0.5, first_token=1.0, token_times=(1.0, 1.5, 2.5), finish=2.5,
                 cached=2, preemptions=1, recomputed=5)
    b = make_seq("b", "bob", 1.0, prompt=8, scheduled=1.0, first_token=3.0, token_times=(3.0, 3.25), finish=3.25,
                 reason=FinishReason.LENGTH)
    c = make_seq("c", "alice", 2.0, scheduled=2.0, first_token=4.0, token_times=(4.0,), finish=4.0,
                 reason=FinishReason.STOP)
    d = make_seq("d", "bob", 0.5, scheduled=0.5, first_token=2.0, token_times=(2.0,), finish=2.2,
                 reason=FinishReason.CANCELLED, cached=4)
    m = MetricsCollector(MAX_NUM_SEQS)
    m.record_step(make_plan(0, [a, d], 10, 0), 0.6, 0.1, running=2, waiting=2, swapped=0, decoding=0,
                  free_blocks=10, cached_blocks=1, used_blocks=3)
    m.record_step(make_plan(1, [b], 6, 0), 1.1, 0.5, running=2, waiting=1, swapped=0, decoding=1,
                  free_blocks=8, cached_blocks=1, used_blocks=5)
    m.record_step(make_plan(2, [a, b], 0, 2, preempted=[d]), 1.5, 0.4, running=2, waiting=1, swapped=1,
                  decoding=2, free_blocks=7, cached_blocks=2, used_blocks=5)
    m.record_step(make_plan(3, [c], 0, 1), 4.0, 2.5, running=1, waiting=0, swapped=0, decoding=1,
                  free_blocks=12, cached_blocks=2, used_blocks=0)
    for seq in (a, d, b, c):
        m.record_finished(seq)
    m.record_rejected("e", "alice", 3, 0.25, 100, "prompt too long")
    return m


def summary_of(m: MetricsCollector) -> dict:
    return summarize(m.requests, m.steps, max_num_seqs=m.max_num_seqs, kv_peak_blocks=9, wall_s=0.05)


def approx_dist(**kw):
    return {k: pytest.approx(v) for k, v in kw.items()}


# ---------------------------------------------------------------------------------------------
# percentiles


def test_percentile_matches_numpy_linear():
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile(xs, 90) == pytest.approx(90.1)
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 100.0
    assert percentile(sorted([3, 1, 4, 1, 5, 9, 2, 6]), 90) == pytest.approx(6.9)
    assert percentile([10.0, 20.0], 25) == pytest.approx(12.5)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_distribution_fields_and_empty():
    d = distribution([4.0, 1.0, 3.0, 2.0])
    assert tuple(d) == LATENCY_FIELDS
    assert d == approx_dist(mean=2.5, p50=2.5, p90=3.7, p95=3.85, p99=3.97, max=4.0)
    assert distribution([]) == dict.fromkeys(LATENCY_FIELDS)


# ---------------------------------------------------------------------------------------------
# collection


def test_record_step_stores_plain_tuple(collector):
    row = collector.steps[2]
    assert type(row) is tuple
    assert all(isinstance(v, (int, float)) for v in row)
    r = StepRow(*row)
    assert (r.step, r.time_s, r.duration_s, r.num_seqs) == (2, 1.5, 0.4, 2)
    assert (r.prefill_tokens, r.decode_tokens, r.preemptions) == (0, 2, 1)
    assert (r.running, r.waiting, r.swapped, r.decoding) == (2, 1, 1, 2)
    assert (r.free_blocks, r.cached_blocks, r.used_blocks) == (7, 2, 5)


def test_record_finished_and_rejected(collector):
    a, d, b, c, e = collector.requests
    assert a.id == "a" and a.tenant == "alice" and a.finish_reason == "eos"
    assert type(a.finish_reason) is str
    assert (a.prompt_tokens, a.cached_prompt_tokens, a.output_tokens) == (4, 2, 3)
    assert (a.preemptions, a.recomputed_tokens) == (1, 5)
    assert a.token_times == (1.0, 1.5, 2.5)
    assert (a.first_scheduled_s, a.prefill_done_s, a.first_token_s, a.finish_s) == (0.5, 1.0, 1.0, 2.5)
    assert d.finish_reason == "cancelled"
    assert e.finish_reason == "rejected" and e.error == "prompt too long" and e.priority == 3
    assert (e.first_scheduled_s, e.first_token_s, e.finish_s, e.output_tokens, e.token_times) == (
        None, None, None, 0, ())


def test_parallel_sample_child_recorded_by_seq_id():
    seq = make_seq("r", "t", 0.0, scheduled=0.0, first_token=1.0, token_times=(1.0,), finish=1.0)
    seq.seq_id = "r#1"
    m = MetricsCollector(1)
    m.record_finished(seq)
    assert m.requests[0].id == "r#1"


# ---------------------------------------------------------------------------------------------
# summary


def test_summary_keys_exact(collector):
    assert tuple(summary_of(collector)) == SUMMARY_KEYS


def test_recompute_tax_is_recomputed_over_every_computed_token(collector):
    # the steps computed 10 + 6 + 0 + 0 prefill and 0 + 0 + 2 + 1 decode tokens: 19; a recomputed 5
    assert summary_of(collector)["recompute_tax"] == 5 / 19
    kw = dict(max_num_seqs=MAX_NUM_SEQS, kv_peak_blocks=9, wall_s=0.05)
    tenants = summarize_by_tenant(collector.requests, collector.steps, **kw)
    assert tenants["alice"]["recompute_tax"] == 5 / 19  # a tenant's share of the run's tax
    assert tenants["bob"]["recompute_tax"] == 0.0
    assert summarize([], [], **kw)["recompute_tax"] is None  # nothing computed


def test_counts_and_latencies(collector):
    s = summary_of(collector)
    assert (s["requests"], s["completed"], s["rejected"]) == (5, 3, 1)
    assert s["ttft_s"] == approx_dist(mean=5 / 3, p50=2.0, p90=2.0, p95=2.0, p99=2.0, max=2.0)
    assert s["tpot_s"] == approx_dist(mean=0.5, p50=0.5, p90=0.7, p95=0.725, p99=0.745, max=0.75)
    assert s["itl_s"] == approx_dist(mean=1.75 / 3, p50=0.5, p90=0.9, p95=0.95, p99=0.99, max=1.0)
    assert s["e2e_s"] == approx_dist(mean=2.25, p50=2.25, p90=2.45, p95=2.475, p99=2.495, max=2.5)
    assert s["queue_s"] == approx_dist(mean=0.5 / 3, p50=0.0, p90=0.4, p95=0.45, p99=0.49, max=0.5)


def test_throughput_and_request_totals(collector):
    s = summary_of(collector)
    assert s["duration_s"] == pytest.approx(4.0)  # first arrival 0.0 (a) to last finish 4.0 (c)
    assert s["wall_s"] == 0.05
    assert s["output_tokens"] == 7  # a 3 + b 2 + c 1 + cancelled d 1; rejected e none
    assert s["output_throughput_tok_s"] == pytest.approx(1.75)
    assert s["request_throughput_req_s"] == pytest.approx(0.75)
    assert (s["preemptions"], s["recomputed_tokens"]) == (1, 5)
    assert s["prefix_hit_rate"] == pytest.approx(6 / 20)  # rejected e's 100 prompt tokens excluded
    assert s["kv_peak_blocks"] == 9


def test_step_level_fields(collector):
    s = summary_of(collector)
    assert s["steps"] == 4
    assert s["mean_batch_size"] == pytest.approx(6 / 4)
    assert s["slot_utilization"] == pytest.approx((2 + 2 + 2 + 1) / (4 * MAX_NUM_SEQS))
    assert s["prefill_token_share"] == pytest.approx(16 / 19)
    assert s["zero_decode_steps"] == 1  # step 1: one sequence wanted a decode, none was scheduled


def test_zero_decode_steps_ignores_steps_nobody_wanted_a_decode():
    m = MetricsCollector(8)
    seq = make_seq("x", "t", 0.0)
    for step, (decoding, decode) in enumerate([(0, 0), (3, 0), (3, 3), (1, 0), (0, 0), (2, 1)]):
        m.record_step(make_plan(step, [seq], 4, decode), float(step), 1.0, 3, 0, 0, decoding, 0, 0, 0)
    assert summarize([], m.steps, max_num_seqs=8, kv_peak_blocks=0, wall_s=0.0)["zero_decode_steps"] == 2


def test_rejected_only_and_empty_runs_give_none_not_nan():
    m = MetricsCollector(2)
    m.record_rejected("r", "t", 0, 1.0, 10, "too long")
    s = summary_of(m)
    assert (s["requests"], s["completed"], s["rejected"], s["steps"]) == (1, 0, 1, 0)
    assert s["duration_s"] == 0.0
    assert s["output_throughput_tok_s"] == 0.0 and s["request_throughput_req_s"] == 0.0
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"):
        assert s[key] == dict.fromkeys(LATENCY_FIELDS)
    for key in ("prefix_hit_rate", "mean_batch_size", "slot_utilization", "prefill_token_share"):
        assert s[key] is None
    empty = summarize([], [], max_num_seqs=1, kv_peak_blocks=0, wall_s=0.0)
    assert empty["requests"] == 0 and empty["duration_s"] == 0.0
    json.dumps(empty, allow_nan=False)


def test_per_tenant_split(collector):
    kw = dict(max_num_seqs=MAX_NUM_SEQS, kv_peak_blocks=9, wall_s=0.05)
    tenants = summarize_by_tenant(collector.requests, collector.steps, **kw)
    assert list(tenants) == ["alice", "bob"]
    alice, bob = tenants["alice"], tenants["bob"]
    assert tuple(alice) == SUMMARY_KEYS
    assert (alice["requests"], alice["completed"], alice["rejected"]) == (3, 2, 1)
    assert (bob["requests"], bob["completed"], bob["rejected"]) == (2, 1, 0)
    assert alice["ttft_s"]["p50"] == pytest.approx(1.5)
    assert bob["ttft_s"] == approx_dist(mean=2.0, p50=2.0, p90=2.0, p95=2.0, p99=2.0, max=2.0)
    assert bob["itl_s"]["max"] == pytest.approx(0.25)
    assert alice["duration_s"] == pytest.approx(4.0) and bob["duration_s"] == pytest.approx(2.75)
    assert alice["output_tokens"] == 4 and bob["output_tokens"] == 3
    assert bob["output_throughput_tok_s"] == pytest.approx(3 / 2.75)
    assert alice["prefix_hit_rate"] == pytest.approx(2 / 8)
    assert bob["prefix_hit_rate"] == pytest.approx(4 / 12)
    assert alice["preemptions"] == 1 and bob["preemptions"] == 0
    glob = summary_of(collector)
    for key in ("steps", "mean_batch_size", "slot_utilization", "prefill_token_share", "zero_decode_steps",
                "kv_peak_blocks"):
        assert alice[key] == glob[key] == bob[key]


def test_per_priority_split_matches_the_same_groups_by_tenant(collector):
    kw = dict(max_num_seqs=MAX_NUM_SEQS, kv_peak_blocks=9, wall_s=0.05)
    recs = [r._replace(priority=0 if r.tenant == "alice" else 1) for r in collector.requests]
    by_priority = summarize_by_priority(recs, collector.steps, **kw)
    by_tenant = summarize_by_tenant(recs, collector.steps, **kw)
    assert list(by_priority) == ["0", "1"]  # JSON keys, most urgent first
    assert by_priority["0"] == by_tenant["alice"] and by_priority["1"] == by_tenant["bob"]
    text = format_summary_table(document_of(recs, collector.steps))
    assert "  priority" in text and "  tenant" in text


def document_of(records, steps):
    m = MetricsCollector(MAX_NUM_SEQS)
    m.requests.extend(records)
    m.steps.extend(steps)
    return result_document("fcfs", {"name": "toy"}, {"name": "sim"}, {}, m, kv_peak_blocks=0, wall_s=0.0)


# ---------------------------------------------------------------------------------------------
# result document, JSON and CSV


def document(collector, policy="fcfs") -> dict:
    return result_document(
        policy,
        {"name": "toy", "rate": float("nan"), "path": Path("w.jsonl"), "sizes": (1, 2)},
        {"name": "simulated", "cost_model": "linear"},
        {"max_num_seqs": MAX_NUM_SEQS, "inf": float("inf"), "reason": FinishReason.EOS},
        collector,
        kv_peak_blocks=9,
        wall_s=0.05,
    )


def test_result_document_json_round_trip(collector, tmp_path):
    doc = document(collector)
    assert set(doc) == {"policy", "workload", "executor", "config", "summary", "tenants", "priorities", "fairness"}
    text = json.dumps(doc, allow_nan=False)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == doc
    assert doc["workload"] == {"name": "toy", "rate": None, "path": "w.jsonl", "sizes": [1, 2]}
    assert doc["config"]["inf"] is None and doc["config"]["reason"] == "eos"
    assert doc["summary"] == summary_of(collector)
    assert list(doc["tenants"]) == ["alice", "bob"]
    write_json(tmp_path / "out" / "run.json", doc)
    assert json.loads((tmp_path / "out" / "run.json").read_text()) == doc


def test_requests_csv(collector, tmp_path):
    path = tmp_path / "requests.csv"
    write_requests_csv(path, collector.requests)
    lines = path.read_text().splitlines()
    assert lines[0] == ("id,tenant,priority,arrival_s,first_scheduled_s,first_token_s,finish_s,"
                        "prompt_tokens,cached_prompt_tokens,output_tokens,preemptions,finish_reason")
    assert lines[1] == "a,alice,0,0.0,0.5,1.0,2.5,4,2,3,1,eos"
    assert lines[5] == "e,alice,3,0.25,,,,100,0,0,0,rejected"
    assert len(lines) == 6
    assert len(list(csv.reader(io.StringIO(path.read_text())))) == 6


def test_steps_csv(collector, tmp_path):
    path = tmp_path / "steps.csv"
    write_steps_csv(path, collector.steps)
    lines = path.read_text().splitlines()
    assert lines[0] == ("step,time_s,running,waiting,swapped,prefill_tokens,decode_tokens,"
                        "free_blocks,cached_blocks,preemptions,duration_s")
    assert lines[3] == "2,1.5,2,1,1,0,2,7,2,1,0.4"
    assert len(lines) == 5


# ---------------------------------------------------------------------------------------------
# terminal tables


def test_summary_table(collector):
    text = format_summary_table(document(collector))
    title = text.splitlines()[0]
    assert "fcfs" in title and "toy" in title and "simulated" in title
    assert "1.75" in text  # tok/s
    assert "0.750" in text  # req/s
    assert "30.0%" in text  # prefix hit rate
    assert "43.8%" in text  # slot utilisation 7/16
    assert "84.2%" in text  # prefill share 16/19
    ttft_row = next(line for line in text.splitlines() if line.strip().startswith("TTFT"))
    assert ttft_row.split()[1:] == ["1666.67", "2000.00", "2000.00", "2000.00", "2000.00", "2000.00"]
    tpot_row = next(line for line in text.splitlines() if line.strip().startswith("TPOT"))
    assert tpot_row.split()[1:] == ["500.00", "500.00", "700.00", "725.00", "745.00", "750.00"]
    alice = next(line for line in text.splitlines() if line.strip().startswith("alice"))
    alice_preempted = sum(r.preemptions for r in collector.requests if r.tenant == "alice")
    # the hand-made collector records no running counts: running mean and max print as "-"
    assert alice.split() == ["alice", "3", "2", "1.00", "1500.00", "1990.00", str(alice_preempted), "-", "-"]
    assert any(line.strip().startswith("bob") for line in text.splitlines())


def test_summary_table_single_tenant_and_empty():
    m = MetricsCollector(2)
    m.record_rejected("r", "only", 0, 0.0, 5, "no")
    text = format_summary_table(result_document("srpt", {"name": "w"}, {"name": "e"}, {}, m,
                                                kv_peak_blocks=0, wall_s=0.0))
    assert "srpt" in text and "only" not in text
    ttft_row = next(line for line in text.splitlines() if line.strip().startswith("TTFT"))
    assert ttft_row.split()[1:] == ["-"] * 6


def test_comparison_table(collector):
    docs = [document(collector, "fcfs"), document(collector, "srpt"), document(collector, "fcfs")]
    text = format_comparison_table(docs)
    shared, blank, header = text.splitlines()[:3]
    assert shared.startswith("workload ") and " | executor " in shared and blank == ""  # the same in every run
    assert not any(line.startswith(("workload", "executor")) for line in text.splitlines()[1:])
    assert header.split() == ["fcfs", "srpt", "fcfs#2"]
    tok = next(line for line in text.splitlines() if line.startswith("throughput (tok/s)"))
    assert tok.split()[-3:] == ["1.75"] * 3
    p50 = next(line for line in text.splitlines() if line.startswith("TTFT p50 (ms)"))
    assert p50.split()[-3:] == ["2000.00"] * 3
    assert not any(line.startswith("TTFT p90") for line in text.splitlines())  # in the JSON only
    bob = next(line for line in text.splitlines() if line.startswith("TTFT p99 bob (ms)"))
    assert bob.split()[-3:] == ["2000.00"] * 3  # one row per tenant
    rejected_only = next(line for line in text.splitlines() if line.startswith("TTFT p99 priority 3 (ms)"))
    assert rejected_only.split()[-3:] == ["-"] * 3  # class 3 holds only the rejected request
    widths = {len(line) for line in text.splitlines()[2:]}
    assert len(widths) == 1


def test_a_comparison_of_many_runs_fits_100_columns(collector):
    """Runs that do not fit 100 columns go to a second table under the first, as even as can be,
    each with the row labels; a row that differs between runs stays in the table."""
    names = ["fcfs", "static", "priority", "srpt", "weighted_fair", "token_rr", "fcfs+decode_first",
             "srpt+reserve+decode_first"]
    docs = [document(collector, name) for name in names]
    docs[1]["workload"] = "other"
    text = format_comparison_table(docs)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0].startswith("executor ") and "workload" not in lines[0]  # the workload differs: a row
    headers = [line.split() for line in lines if line.strip() and line.split()[0] in names]
    assert [h for table in headers for h in table] == names  # every run once, in order
    assert len(headers) == 2 and abs(len(headers[0]) - len(headers[1])) <= 1
    rows = [line.split()[0] for line in lines if line.startswith("workload")]
    assert len(rows) == 2  # the row labels in each table


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_printed_table_is_plain_in_a_pipe_and_coloured_on_a_terminal(collector):
    doc = document(collector)
    pipe, tty = io.StringIO(), FakeTTY()
    print_summary_table(doc, pipe)
    print_summary_table(doc, tty)
    assert pipe.getvalue() == format_summary_table(doc)  # what tests and CI read
    assert "\x1b[" not in pipe.getvalue() and "\x1b[" in tty.getvalue()
    without_codes = re.sub(r"\x1b\[[0-9;]*m", "", tty.getvalue())
    assert [line.split() for line in without_codes.splitlines()] == [line.split() for line in pipe.getvalue().splitlines()]
