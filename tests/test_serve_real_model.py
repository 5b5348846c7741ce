"""The server over a real model (a seeded random tiny Llama on the torch executor): 64 concurrent
streams over a KV pool too small for them, a fifth of the clients hanging up mid-stream. Every
other stream gets exactly the greedy tokens its prompt gets alone, so neither the concurrent
batches, nor the preemptions and recomputations they force, nor the blocks the hung-up requests
gave back changed anyone's attention; afterwards every block is free."""

from __future__ import annotations

import random

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_serve import ids, stream_all  # noqa: E402
from torch_helpers import VOCAB, tiny_llama  # noqa: E402

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.requests.request import Request, SamplingParams  # noqa: E402
from metroline.core.serving.server import ServerThread, make_engine  # noqa: E402
from metroline.core.serving.tenants import ServeConfig  # noqa: E402
from metroline.core.serving.tokens import StandInTokenizer  # noqa: E402
from metroline.core.step.engine import Engine  # noqa: E402
from metroline.executors.torch import TorchExecutor  # noqa: E402


def test_64_streams_on_a_real_model_with_a_fifth_hanging_up_get_their_greedy_tokens_alone():
    rng = random.Random(11)
    model = tiny_llama(seed=5)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 60))] for _ in range(64)]
    lengths = [300 if i % 5 == 0 else rng.randrange(4, 40) for i in range(64)]
    hung_up = {i for i in range(64) if i % 5 == 0}
    # the alone references first, each on an engine of its own
    alone = []
    for i, (prompt, n) in enumerate(zip(prompts, lengths)):
        if i in hung_up:
            alone.append(None)
            continue
        out = Engine(EngineConfig(), TorchExecutor(model)).generate([Request(
            request_id="r", prompt_token_ids=prompt, sampling=SamplingParams(max_new_tokens=n, temperature=0.0))])
        alone.append(out["r"][0].output_token_ids)
    # 32 slots of requests up to ~100 tokens (7 blocks of 16 each) over 96 blocks: they preempt
    # one another; the stand-in tokenizer renders token ids as text (" 17"), so the text gives them back
    engine = make_engine(EngineConfig(num_blocks=96, block_size=16, max_num_seqs=32), TorchExecutor(model))
    bodies = [{"prompt": p, "max_tokens": n, "temperature": 0} for p, n in zip(prompts, lengths)]
    with ServerThread(engine, ServeConfig(), tokenizer=StandInTokenizer()) as srv:
        results, m = stream_all(srv, "/v1/completions", bodies, hung_up)
    for i, (status, text, reason) in enumerate(results):
        assert status == 200
        if i in hung_up:
            assert reason == "hung up"
        else:
            assert (ids(text), reason) == (alone[i], "length"), i
    assert m[("metroline_preemptions_total", ())] > 0  # the pool was too small: preemptions happened
    assert m[("metroline_requests_finished_total", (("reason", "cancelled"), ("tenant", "default")))] == len(hung_up)


def _reference_logprobs(model, prompt: list[int], output: list[int], k: int) -> list[tuple[float, list[int]]]:
    """(log-probability of each output token, the ids of the k most likely) from one eager HF
    forward over prompt + output: the raw distribution at each position."""
    import torch

    saved = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + output])).logits[0].float()
    finally:
        model.set_attn_implementation(saved)
    lp = torch.log_softmax(logits, dim=-1)
    rows = [lp[len(prompt) - 1 + j] for j in range(len(output))]
    return [(row[tok].item(), row.topk(k).indices.tolist()) for row, tok in zip(rows, output)]


def test_logprobs_over_http_equal_the_models_own_distribution():
    """`logprobs` on both endpoints, streamed and not, against one HF forward of the same model
    over the prompt and the tokens it generated: each token's log-probability (to float32
    rounding) and its top alternatives, in order; a completion's `text_offset` counts the tokens'
    texts; the chunks of a stream carry every token's entry once. The simulated executor, which
    has no logits, answers 400 naming the field."""
    import json

    model = tiny_llama(seed=7)
    tok = StandInTokenizer()
    prompt = [5, 99, 17, 3, 64]
    engine = make_engine(EngineConfig(num_blocks=64), TorchExecutor(model))
    with ServerThread(engine, ServeConfig(), tokenizer=tok) as srv:
        body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 3}
        doc = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0,
                "logprobs": True, "top_logprobs": 2, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=chat, timeout=60) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    choice = doc["choices"][0]
    output = ids(choice["text"])
    lp = choice["logprobs"]
    assert len(output) == 6 and lp["tokens"] == [f" {t}" for t in output]
    reference = _reference_logprobs(model, prompt, output, 3)
    assert lp["token_logprobs"] == pytest.approx([r for r, _ in reference], abs=1e-4)
    assert [[ids(t)[0] for t in top] for top in lp["top_logprobs"]] == [top for _, top in reference]
    assert lp["text_offset"] == [sum(len(f" {t}") for t in output[:j]) for j in range(6)]
    # the stream: each chunk reports its own tokens; together, one entry per token
    content = [e for ev in events if ev["choices"] and ev["choices"][0]["logprobs"]
               for e in ev["choices"][0]["logprobs"]["content"]]
    streamed = ids("".join(ev["choices"][0]["delta"].get("content", "") for ev in events if ev["choices"]))
    chat_prompt = tok.chat_prompt([("user", "hi")])
    reference = _reference_logprobs(model, chat_prompt, streamed, 2)
    assert [ids(e["token"])[0] for e in content] == streamed and len(streamed) == 5
    assert [e["logprob"] for e in content] == pytest.approx([r for r, _ in reference], abs=1e-4)
    assert [[ids(t["token"])[0] for t in e["top_logprobs"]] for e in content] == [top for _, top in reference]
    assert all(e["bytes"] == list(e["token"].encode()) for e in content)
    # no logits, no logprobs
    from test_serve import sim_server

    with sim_server() as srv:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "logprobs": 1})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "logprobs")
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                                "top_logprobs": 2})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "top_logprobs")
