"""The server over a real model (a seeded random tiny Llama on the torch executor): 64 concurrent
streams over a KV pool too small for them, a fifth of the clients hanging up mid-stream. Every
other stream gets exactly the greedy tokens its prompt gets alone, so neither the concurrent
batches, nor the preemptions and recomputations they force, nor the blocks the hung-up requests
gave back changed anyone's attention; afterwards every block is free."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.engine import Engine  # noqa: E402
from metroline.core.request import Request, SamplingParams  # noqa: E402
from metroline.core.serving.server import ServerThread, make_engine  # noqa: E402
from metroline.core.serving.tenants import ServeConfig  # noqa: E402
from metroline.core.serving.tokens import StandInTokenizer  # noqa: E402
from metroline.executors.torch import TorchExecutor  # noqa: E402

from test_serve import _stream, all_free_or_evictable, ids, metrics  # noqa: E402
from torch_helpers import VOCAB, tiny_llama  # noqa: E402


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
    with ServerThread(engine, ServeConfig(), tokenizer=StandInTokenizer()) as srv:
        async def main():
            async with httpx.AsyncClient(timeout=120) as client:
                url = srv.url + "/v1/completions"
                return await asyncio.gather(*(
                    _stream(client, url, {"prompt": p, "max_tokens": n, "temperature": 0},
                            stop_after=3 if i in hung_up else None)
                    for i, (p, n) in enumerate(zip(prompts, lengths))))
        results = asyncio.run(main())
        for _ in range(1000):  # the loop frees the hung-up requests' blocks at its next steps
            if not srv.engine.has_unfinished():
                break
            asyncio.run(asyncio.sleep(0.01))
        all_free_or_evictable(srv.engine)
        m = metrics(srv.url)
    for i, (status, text, reason) in enumerate(results):
        assert status == 200
        if i in hung_up:
            assert reason == "hung up"
        else:
            assert (ids(text), reason) == (alone[i], "length"), i
    assert m[("metroline_preemptions_total", ())] > 0  # the pool was too small: preemptions happened
    assert m[("metroline_requests_finished_total", (("reason", "cancelled"), ("tenant", "default")))] == len(hung_up)
