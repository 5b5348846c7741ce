"""Speculative decoding in the core: drafts in the budget and the KV, a variable advance, the roll-back.

The simulator's stand-in tokens depend only on the sequence and its position, so a run with drafts
must give exactly the tokens of the run without them, whatever is accepted. A toy model (a fixed
bigram table, rows of floats for the pure-python `Sampler`) checks the verification itself: greedy
and seeded outputs equal the plain run's, and at temperature 1 the tokens follow the target's
distribution (a chi-square test, whose power a planted wrong distribution shows).
"""

from __future__ import annotations

import json
import math
import random

import pytest
from conftest import assert_pool_drained, live_tables

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginError
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.request import Request, SamplingParams
from metroline.core.speculative_config import SpeculativeConfig, parse_speculative_config
from metroline.core.step.engine import Engine
from metroline.core.step.plan import StepPlan, StepResult
from metroline.executors.ngram import ngram_propose
from metroline.executors.registry import make_executor


def _requests(seed: int, count: int = 10, shared: int = 0, n: int = 1) -> list[Request]:
    rng = random.Random(seed)
    prefix = [rng.randrange(1, 50) for _ in range(shared)]
    return [
        Request(
            request_id=f"r{i}", prompt_token_ids=prefix + [rng.randrange(1, 50) for _ in range(rng.randrange(2, 25))],
            sampling=SamplingParams(max_new_tokens=rng.randrange(1, 30), n=n),
        )
        for i in range(count)
    ]


def _run(spec, requests, executor=None, plugins=(), eos=None, **config):
    fields = dict(block_size=4, num_blocks=300, max_num_seqs=8, max_num_batched_tokens=64)
    fields.update(config)
    engine = Engine(EngineConfig(**fields, speculative_config=spec), executor or make_executor("sim"),
                    plugins=plugins, eos_token_id=eos)
    for r in requests:
        engine.add_request(r)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        engine.pool.check_invariants(live_tables(engine))
        steps += 1
        assert steps < 5000
    assert_pool_drained(engine)
    outputs = {rid: [s.output_token_ids for s in engine.sequences(rid)] for rid in engine.intake.requests}
    return engine, outputs, steps


SPEC = {"num_speculative_tokens": 3}


@pytest.mark.parametrize("extra", [
    {}, {"num_blocks": 40}, {"num_blocks": 40, "preemption_mode": "swap", "swap_space_blocks": 200},
    {"max_num_batched_tokens": 8, "max_prefill_chunk": 5}, {"prefix_match": "token"},
])
@pytest.mark.parametrize("rate", [0.0, 0.6, 1.0])
def test_drafts_change_the_steps_never_the_tokens(rate, extra):
    requests = _requests(3, shared=9, n=2 if extra.get("prefix_match") else 1)
    _, plain, plain_steps = _run(None, requests, **extra)
    engine, spec, steps = _run({**SPEC, "acceptance_rate": rate}, _requests(3, shared=9, n=2 if extra.get("prefix_match") else 1), **extra)
    assert spec == plain
    c = engine.scheduler.speculation.counters
    assert c.num_draft_tokens > 0
    if rate == 0.0:  # (drafts take budget and blocks, which may delay a prefill when both are short)
        assert c.num_accepted_tokens == 0 and (steps == plain_steps or extra)
    if rate == 1.0 and not extra:
        assert c.num_accepted_tokens == c.num_draft_tokens and steps < plain_steps


def test_a_decode_advances_by_its_accepted_drafts_plus_one_and_rolls_back_the_rest():
    """Acceptance by position (1, 0): each drafting step accepts exactly one of its 3 drafts, so
    a decode advances 2 tokens a step; its KV slots covered 4 positions, and the block that held
    only rejected slots is free after the step."""
    spec = {**SPEC, "acceptance_by_position": [1.0, 0.0]}
    engine = Engine(EngineConfig(block_size=4, num_blocks=50, speculative_config=spec), make_executor("sim"))
    engine.add_request(Request(request_id="a", prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_new_tokens=20)))
    engine.step()  # the prompt: one token out, position 3 is next
    seq = engine.sequences("a")[0]
    assert (len(seq.token_ids), seq.num_computed_tokens, len(seq.block_table)) == (4, 3, 1)
    plan = engine.scheduler.schedule(engine.executor.now())
    assert plan.scheduled[seq] == 4 and plan.drafts[seq] == 3 and plan.num_decode_tokens == 4
    assert len(seq.block_table) == 2  # positions 3..6
    result = engine.executor.execute(plan)
    assert result.accepted == {seq: 1}
    engine.scheduler.commit(plan)
    engine._sample(plan, result.logits, result.time, None, result)
    assert (len(seq.token_ids), seq.num_computed_tokens) == (6, 5)  # 1 accepted + the bonus
    assert len(seq.block_table) == 2  # position 4 holds accepted KV: the block stays
    assert seq.num_draft_tokens == 3 and seq.num_accepted_tokens == 1
    assert seq.num_draft_rejections == 1  # draft 2 was rejected; draft 3, after it, was never tested


def test_rejected_slots_are_freed_and_never_indexed():
    engine = Engine(EngineConfig(block_size=2, num_blocks=50, speculative_config={**SPEC, "acceptance_rate": 0.0}),
                    make_executor("sim"))
    engine.add_request(Request(request_id="a", prompt_token_ids=[1, 2, 3, 4], sampling=SamplingParams(max_new_tokens=9)))
    engine.step()
    seq = engine.sequences("a")[0]
    for _ in range(4):
        engine.step()
        assert len(seq.block_table) == -(-seq.num_computed_tokens // 2)
        assert seq.num_cached_blocks == seq.num_computed_tokens // 2
        indexed = [b for b in seq.block_table if engine.pool._indexed[b]]
        assert indexed == seq.block_table[: seq.num_cached_blocks]


def test_max_tokens_and_stop_tokens_cut_an_accepted_run():
    # max_new_tokens: drafts are capped at what is left; every draft accepted
    engine, out, _ = _run({**SPEC, "acceptance_rate": 1.0},
                          [Request(request_id="a", prompt_token_ids=[5, 6], sampling=SamplingParams(max_new_tokens=6))])
    assert len(out["a"][0]) == 6
    # a stop token in the middle of an accepted run: the run ends there
    _, plain, _ = _run(None, [Request(request_id="b", prompt_token_ids=[5, 6], sampling=SamplingParams(max_new_tokens=30))])
    stop = plain["b"][0][4]
    req = Request(request_id="b", prompt_token_ids=[5, 6], sampling=SamplingParams(max_new_tokens=30, stop_token_ids=[stop]))
    engine, out, _ = _run({**SPEC, "acceptance_rate": 1.0}, [req])
    assert out["b"][0] == plain["b"][0][:5]
    seq = engine.sequences("b")[0]
    assert seq.finish_reason.value == "stop"
    assert seq.num_accepted_tokens > 0 and seq.num_draft_rejections == 0  # a stop's cut is no rejection


def test_an_abort_frees_a_drafting_request():
    engine = Engine(EngineConfig(block_size=4, num_blocks=50, speculative_config=SPEC), make_executor("sim"))
    for r in _requests(1, count=3):
        engine.add_request(r)
    for _ in range(3):
        engine.step()
    for rid in list(engine.intake.requests):
        engine.abort(rid)
    engine.step()
    assert not engine.has_unfinished()
    assert_pool_drained(engine)


# --- the hook ------------------------------------------------------------------------------------


class Drafts:
    def __init__(self, answer):
        self.answer = answer

    @hookimpl
    def num_draft_tokens(self, decodes, max_drafts):
        return self.answer(decodes, max_drafts)


def test_the_hook_decides_each_decodes_drafts():
    seen = []

    def only_first(decodes, max_drafts):
        seen.append(len(decodes))
        return [max_drafts if i == 0 else 0 for i in range(len(decodes))]

    engine, _, _ = _run({**SPEC, "acceptance_rate": 1.0}, _requests(2, count=4), plugins=[Drafts(only_first)])
    assert seen and max(seen) > 1
    assert engine.scheduler.speculation.counters.num_drafts <= len([n for n in seen if n])


@pytest.mark.parametrize("answer", [lambda d, m: [m + 1] * len(d), lambda d, m: [1], lambda d, m: [True] * len(d)])
def test_a_nonsense_draft_count_is_an_error_naming_the_hook(answer):
    with pytest.raises(PluginError, match="num_draft_tokens"):
        _run(SPEC, _requests(2, count=3), plugins=[Drafts(answer)])


def test_no_speculation_never_calls_the_hook():
    _run(None, _requests(2, count=3), plugins=[Drafts(lambda d, m: pytest.fail("called"))])


def test_the_config_takes_vllms_shape_and_names_bad_fields():
    spec = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}')
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max, spec.lookahead) == (3, 3, 0)
    assert parse_speculative_config({"model": "x", "num_speculative_tokens": 2}).method == "draft_model"
    assert SpeculativeConfig(method="draft_model", model="x", num_speculative_tokens=5).lookahead == 5
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 0}')
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        parse_speculative_config('{"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}')
    with pytest.raises(ValueError, match="nonsense"):
        parse_speculative_config('{"num_speculative_tokens": 2, "nonsense": 1}')
    with pytest.raises(ValueError, match="model"):
        parse_speculative_config('{"method": "draft_model", "num_speculative_tokens": 2}')


def test_acceptance_draws_are_paired_across_runs():
    """The same request accepts the same drafts at the same positions whatever else runs."""
    a, _, _ = _run({**SPEC, "acceptance_rate": 0.5, "seed": 7}, _requests(4))
    b, _, _ = _run({**SPEC, "acceptance_rate": 0.5, "seed": 7}, _requests(4))
    assert a.scheduler.speculation.counters.as_dict() == b.scheduler.speculation.counters.as_dict()
    model = a.executor._acceptance
    seq = a.sequences("r0")[0]
    assert [model.accepted(seq, k) for k in (1, 2, 3)] == [min(model.accepted(seq, 3), k) for k in (1, 2, 3)]


# --- verification on a toy model --------------------------------------------------------------------

VOCAB = 12


def _bigram(seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.gauss(0, 1.5) for _ in range(VOCAB)] for _ in range(VOCAB)]


class ToyModel:
    """A bigram 'model' on a virtual clock: the logits after a token are its row of the table.
    Drafts by n-gram lookup (`fixed_draft`: always that token instead)."""

    name = "toy"

    def __init__(self, table, fixed_draft=None, draft_rows=None):
        self.table = table
        self.draft_rows = draft_rows or table  # another table: a planted wrong verification
        self.fixed_draft = fixed_draft
        self.clock = 0.0
        self.vocab_size = VOCAB

    def now(self):
        return self.clock

    def idle_until(self, t):
        self.clock = max(self.clock, t)

    def describe(self):
        return {"name": self.name, "cost_model": None}

    def execute(self, plan: StepPlan) -> StepResult:
        self.clock += 1.0
        logits = [list(self.table[s.token_ids[-1]]) for s in plan.sample_seqs]
        if not plan.drafts:
            return StepResult(self.clock, logits)
        drafts, rows = {}, []
        for seq, k in plan.drafts.items():
            proposed = [self.fixed_draft] * k if self.fixed_draft is not None else ngram_propose(seq.token_ids, k, 1, 3)
            drafts[seq] = proposed
            rows += [list(self.draft_rows[t]) for t in proposed]
        return StepResult(self.clock, logits, draft_tokens=drafts, draft_logits=rows)


def _toy_requests(count, temperature, seed=None, max_new=25):
    rng = random.Random(11)
    return [
        Request(request_id=f"t{i}", prompt_token_ids=[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 12))] * 2,
                sampling=SamplingParams(max_new_tokens=max_new, temperature=temperature,
                                        seed=None if seed is None else seed + i))
        for i in range(count)
    ]


@pytest.mark.parametrize("temperature, seed", [(0.0, None), (1.0, 5)])
@pytest.mark.parametrize("extra", [{}, {"num_blocks": 30}, {"max_num_batched_tokens": 6, "max_prefill_chunk": 4}])
def test_toy_model_outputs_equal_the_plain_run(temperature, seed, extra):
    table = _bigram(2)
    _, plain, _ = _run(None, _toy_requests(6, temperature, seed), executor=ToyModel(table), **extra)
    engine, spec, _ = _run({**SPEC, "num_speculative_tokens": 4}, _toy_requests(6, temperature, seed),
                           executor=ToyModel(table), **extra)
    assert spec == plain
    assert engine.scheduler.speculation.counters.num_accepted_tokens > 0


def _chi_square_p(observed: list[int], expected: list[float]) -> float:
    """The upper tail of the chi-square statistic (Wilson-Hilferty's normal approximation)."""
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(observed) - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_speculative_sampling_keeps_the_target_distribution():
    """Prompt [0], three tokens at temperature 1, the decode drafting token 3: the third token
    (sampled after an accepted draft, or after the sampled token that rejected it) must follow the
    target's p3(t) = sum_a,b p(a | 0) p(b | a) p(t | b). A planted wrong verification (the rows
    after a draft from another table) fails the same test."""
    table = _bigram(4)

    def softmax(row):
        m = max(row)
        e = [math.exp(x - m) for x in row]
        return [x / sum(e) for x in e]

    p1 = softmax(table[0])
    p2 = [sum(p1[a] * softmax(table[a])[t] for a in range(VOCAB)) for t in range(VOCAB)]
    target = [sum(p2[b] * softmax(table[b])[t] for b in range(VOCAB)) for t in range(VOCAB)]
    n = 3000
    requests = [Request(request_id=f"s{i}", prompt_token_ids=[0],
                        sampling=SamplingParams(max_new_tokens=3, temperature=1.0, seed=1000 + i)) for i in range(n)]
    expected = [p * n for p in target]
    for draft_rows, right in ((None, True), (_bigram(5), False)):
        engine, out, _ = _run({"num_speculative_tokens": 2}, requests, executor=ToyModel(table, 3, draft_rows),
                              max_num_seqs=256, num_blocks=2000, max_num_batched_tokens=1024)
        assert engine.scheduler.speculation.counters.num_accepted_tokens > 0.05 * n
        counts = [0] * VOCAB
        for outs in out.values():
            counts[outs[0][2]] += 1
        assert (_chi_square_p(counts, expected) > 0.001) is right, counts


def test_ngram_lookup_takes_the_latest_longest_match():
    assert ngram_propose([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2, 1, 3) == [7, 1]
    assert ngram_propose([5, 6, 7], 3, 1, 2) == []
    assert ngram_propose([4, 1, 4], 3, 1, 1) == [1, 4]


def test_the_server_counts_drafts_as_vllm_names_them():
    pytest.importorskip("starlette")
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from metroline.core.serving.server import ServerThread, make_engine
    from metroline.core.serving.tenants import ServeConfig
    from metroline.executors.cost_models import make_cost_model
    from metroline.executors.realtime import RealtimeExecutor
    from metroline.executors.simulated import SimulatedExecutor

    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    engine = make_engine(EngineConfig(speculative_config={**SPEC, "acceptance_rate": 1.0}), executor)
    with ServerThread(engine, ServeConfig()) as srv:
        url = srv.url
        r = httpx.post(url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 9}, timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"][0]["text"].split()) == 9
        text = httpx.get(url + "/metrics").text
    samples = {(s.name, tuple(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    # the prompt's step gives token 1; then 3 drafts (all accepted) + the bonus twice: 1 + 4 + 4 = 9
    assert samples[("metroline_spec_decode_num_drafts_total", ())] == 2
    assert samples[("metroline_spec_decode_num_draft_tokens_total", ())] == 6
    assert samples[("metroline_spec_decode_num_accepted_tokens_total", ())] == 6
    for pos in range(3):
        assert samples[("metroline_spec_decode_num_accepted_tokens_per_pos_total", (("position", str(pos)),))] == 2


def test_the_flag_and_the_config_file_take_vllms_json(tmp_path, capsys):
    from metroline.cli import main

    args = ["run", "--workload", "chat", "--max-requests", "40", "--cost-model", "steps", "--json"]
    spec = '{"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 1.0}'
    assert main([*args, str(tmp_path / "a.json"), "--speculative-config", spec]) == 0
    (tmp_path / "c.toml").write_text(
        '[speculative_config]\nmethod = "ngram"\nnum_speculative_tokens = 2\nacceptance_rate = 1.0\n')
    assert main([*args, str(tmp_path / "b.json"), "--config", str(tmp_path / "c.toml")]) == 0
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["speculation"] == b["speculation"] and a["speculation"]["acceptance_rate"] == 1.0
    assert a["summary"]["mean_acceptance_length"] == pytest.approx(3.0, abs=0.1)  # 2 drafts + the bonus, nearly always
    capsys.readouterr()
    assert main([*args, str(tmp_path / "c.json"), "--speculative-config", "{bad"]) == 2
    assert "--speculative-config: invalid JSON" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "c.json"), "--speculative-config", '{"num_speculative_tokens": 99}']) == 2
    assert "num_speculative_tokens" in capsys.readouterr().err


@pytest.mark.parametrize("lookahead, max_new, drafts, blocks", [
    (4, 2, 0, 1),   # one token left to generate: no draft, so no lookahead either: position 3 only
    (4, 3, 1, 3),   # two left: 1 draft, 1 + 1 + 4 slots: positions 3..8, three blocks
    (2, 20, 3, 3),  # 1 + 3 + 2 slots: positions 3..8, three blocks (one slot fewer: two)
    (1, 20, 3, 2),  # 1 + 3 + 1 slots: positions 3..7, two blocks (one slot more: three)
])
def test_a_drafting_decode_holds_its_drafts_and_lookahead_slots(lookahead, max_new, drafts, blocks):
    """Block size 4, a 3-token prompt (position 3 is the first decode), the hook asking for 3
    drafts: the drafts are cut so that none runs past `max_new_tokens`, and a decode with `k`
    drafts takes the slots of 1 + k + `num_lookahead_tokens` positions; with none it takes the one
    slot of its token."""
    spec = {**SPEC, "num_lookahead_tokens": lookahead}
    engine = Engine(EngineConfig(block_size=4, num_blocks=50, speculative_config=spec), make_executor("sim"),
                    plugins=[Drafts(lambda decodes, most: [most] * len(decodes))])
    engine.add_request(Request(request_id="a", prompt_token_ids=[1, 2, 3],
                               sampling=SamplingParams(max_new_tokens=max_new)))
    engine.step()
    (seq,) = engine.sequences("a")
    assert (len(seq.token_ids), seq.num_computed_tokens, len(seq.block_table)) == (4, 3, 1)
    plan = engine.scheduler.schedule(engine.executor.now())
    assert plan.scheduled[seq] == 1 + drafts and plan.drafts.get(seq, 0) == drafts
    assert len(seq.block_table) == blocks
