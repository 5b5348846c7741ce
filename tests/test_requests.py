"""Validation at the edges: each invalid request field or config field is a pydantic
ValidationError naming the field and the limit; a rejected request leaves the engine serving the
others; a bad workload row is recorded as rejected and the run goes on."""

from __future__ import annotations

import pytest
from conftest import assert_pool_drained, make_engine, request, run_to_end
from pydantic import ValidationError

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.requests.request import Request, SamplingParams
from metroline.core.requests.sequence import FinishReason
from metroline.core.workloads.build import Workload, WorkloadItem
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor


def rejection(data, engine=None):
    """The ValidationError of `data`, validated alone or by `engine.add_request`."""
    with pytest.raises(ValidationError) as info:
        if engine is None:
            Request.model_validate(data)
        else:
            engine.add_request(data)
    return info.value


def only_error(err: ValidationError) -> tuple[tuple, str]:
    errors = err.errors()
    assert len(errors) == 1, errors
    return errors[0]["loc"], str(err)


@pytest.mark.parametrize(
    ("sampling", "loc", "limit"),
    [
        ({"max_new_tokens": 0}, ("sampling", "max_new_tokens"), "greater than or equal to 1"),
        ({"max_new_tokens": -5}, ("sampling", "max_new_tokens"), "greater than or equal to 1"),
        ({"temperature": -0.1}, ("sampling", "temperature"), "greater than or equal to 0"),
        ({"top_p": 0}, ("sampling", "top_p"), "greater than 0"),
        ({"top_p": 1.5}, ("sampling", "top_p"), "less than or equal to 1"),
        ({"n": 0}, ("sampling", "n"), "greater than or equal to 1"),
        ({"top_k": -1}, ("sampling", "top_k"), "greater than or equal to 0"),
        ({"beam_width": 4}, ("sampling", "beam_width"), "Extra inputs are not permitted"),
    ],
)
def test_invalid_sampling_fields_are_named_with_their_limit(sampling, loc, limit):
    loc_got, message = only_error(rejection({"prompt_token_ids": [1, 2], "sampling": sampling}))
    assert loc_got == loc
    assert "sampling." + loc[1] in message and limit in message


def test_limits_that_are_valid_pass():
    params = SamplingParams(max_new_tokens=1, temperature=0.0, top_p=1.0, n=1, top_k=0)
    req = Request(prompt_token_ids=[0], sampling=params)
    assert req.sampling.top_p == 1.0 and req.prompt_token_ids == [0]


def test_empty_prompt_is_rejected():
    loc, message = only_error(rejection({"prompt_token_ids": []}))
    assert loc == ("prompt_token_ids",)
    assert "prompt_token_ids" in message and "at least 1 item" in message


def test_negative_token_ids_are_rejected_naming_the_position():
    loc, message = only_error(rejection({"prompt_token_ids": [5, 6, -1]}))
    assert loc == ("prompt_token_ids", 2)
    assert "prompt_token_ids.2" in message and "greater than or equal to 0" in message


def test_unknown_request_fields_are_rejected():
    loc, message = only_error(rejection({"prompt_token_ids": [1], "max_tokens": 3}))
    assert loc == ("max_tokens",)
    assert "max_tokens" in message and "Extra inputs are not permitted" in message


def test_prompt_plus_max_new_tokens_above_max_model_len_is_rejected_by_the_engine():
    engine = make_engine(max_model_len=64)
    data = request("long", 60, max_new=5)
    Request.model_validate(data)  # valid on its own: the limit is the engine's
    message = str(rejection(data, engine))
    assert "max_model_len=64" in message
    assert "prompt_token_ids (60 tokens) + sampling.max_new_tokens (5) = 65" in message
    engine.add_request(request("fits", 59, max_new=5))  # 64 exactly is fine


def test_a_request_bigger_than_the_kv_pool_is_rejected():
    engine = make_engine(num_blocks=8, block_size=4)  # 32 tokens of KV
    message = str(rejection(request("big", 30, max_new=3), engine))
    assert "num_blocks * block_size = 32" in message and "33 tokens" in message
    engine.add_request(request("fits", 29, max_new=3))


def test_more_samples_than_slots_are_rejected():
    # n samples must run together: n > max_num_seqs could never be admitted
    engine = make_engine(max_num_seqs=2)
    message = str(rejection(request("many", 4, n=3), engine))
    assert "sampling.n (3) exceeds max_num_seqs=2" in message
    engine.add_request(request("two", 4, max_new=2, n=2))
    run_to_end(engine)
    assert [s.num_output_tokens for s in engine.sequences("two")] == [2, 2]


def test_a_validated_request_object_is_checked_against_the_engine_too():
    engine = make_engine(max_model_len=16)
    req = Request(request_id="obj", prompt_token_ids=list(range(1, 15)), sampling=SamplingParams(max_new_tokens=4))
    assert "max_model_len=16" in str(rejection(req, engine))


def test_after_rejected_requests_the_engine_serves_the_others():
    engine = make_engine(max_model_len=32, num_blocks=16)
    bad = [
        {"request_id": "bad-empty", "prompt_token_ids": []},
        request("bad-len", 30, max_new=5),
        request("bad-temp", 4, temperature=-1.0),
        {"request_id": "bad-extra", "prompt_token_ids": [1], "colour": "red"},
    ]
    good = [request(f"good{i}", 3 + i, max_new=2 + i) for i in range(5)]
    for i, g in enumerate(good):
        engine.add_request(g)
        if i < len(bad):
            with pytest.raises(ValidationError):
                engine.add_request(bad[i])
    for b in bad:
        with pytest.raises(KeyError):
            engine.sequences(b["request_id"])
    run_to_end(engine)
    for i in range(5):
        seq = engine.sequences(f"good{i}")[0]
        assert seq.finish_reason is FinishReason.LENGTH and seq.num_output_tokens == 2 + i
    assert sorted(r.id for r in engine.metrics.requests) == [f"good{i}" for i in range(5)]
    assert_pool_drained(engine)


# --- EngineConfig --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_prefill_chunk": 4096, "max_num_batched_tokens": 2048}, ["max_prefill_chunk (4096)", "max_num_batched_tokens (2048)"]),
        ({"preemption_mode": "swap"}, ["preemption_mode='swap'", "swap_space_blocks >= 1"]),
        ({"block_size": 0}, ["block_size", "greater than or equal to 1"]),
        ({"num_blocks": 0}, ["num_blocks", "greater than or equal to 1"]),
        ({"max_num_seqs": 0}, ["max_num_seqs", "greater than or equal to 1"]),
        ({"preemption_mode": "drop"}, ["preemption_mode", "'recompute' or 'swap'"]),
        ({"max_num_batch_tokens": 10}, ["max_num_batch_tokens", "Extra inputs are not permitted"]),
    ],
)
def test_engine_config_errors_name_the_fields(fields, named):
    with pytest.raises(ValidationError) as info:
        EngineConfig(**fields)
    message = str(info.value)
    for text in named:
        assert text in message


def test_engine_config_checks_assignments():
    config = EngineConfig()
    with pytest.raises(ValidationError, match="block_size"):
        config.block_size = 0


def test_engine_accepts_a_dict_config_and_validates_it():
    with pytest.raises(ValidationError, match="max_num_seqs"):
        make_engine(max_num_seqs=-1)


# --- workload rows -------------------------------------------------------------------------------


def test_a_bad_workload_row_is_recorded_as_rejected_and_the_run_goes_on():
    items = [
        WorkloadItem(0.0, ((("row", 0), 8),), 4),
        WorkloadItem(0.0, ((("row", 1), 60),), 10, tenant="t2"),  # 70 tokens > max_model_len 64
        WorkloadItem(0.05, ((("row", 2), 8),), 3),
    ]
    workload = Workload("hand-made", items)
    config = EngineConfig(max_model_len=64, block_size=4, num_blocks=64)
    doc, engine = run_workload(workload, config, SimulatedExecutor(make_cost_model("steps")))
    summary = doc["summary"]
    assert (summary["requests"], summary["completed"], summary["rejected"]) == (3, 2, 1)
    records = {r.id: r for r in engine.metrics.requests}
    assert {rid: r.finish_reason for rid, r in records.items()} == {"0": "length", "1": "rejected", "2": "length"}
    rejected = records["1"]
    assert "max_model_len=64" in rejected.error
    assert (rejected.tenant, rejected.prompt_tokens, rejected.output_tokens) == ("t2", 60, 0)
    assert rejected.first_scheduled_s is None and rejected.finish_s is None
    assert (records["0"].output_tokens, records["2"].output_tokens) == (4, 3)
    assert doc["tenants"]["t2"]["rejected"] == 1
    assert_pool_drained(engine)
