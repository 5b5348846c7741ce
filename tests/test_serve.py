"""The HTTP server: each test starts it in-process on 127.0.0.1 (ephemeral port) on the simulated
executor in real time, and stops it."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.engine import Engine  # noqa: E402
from metroline.core.request import Request, SamplingParams  # noqa: E402
from metroline.core.serving.server import ServerThread, make_engine  # noqa: E402
from metroline.core.serving.tenants import ServeConfig  # noqa: E402
from metroline.core.serving.tokens import ContentTokens, StandInTokenizer  # noqa: E402
from metroline.executors.cost_models import make_cost_model  # noqa: E402
from metroline.executors.realtime import RealtimeExecutor  # noqa: E402
from metroline.executors.simulated import SimulatedExecutor  # noqa: E402

TOK = StandInTokenizer()


def sim_server(step_time: float = 0.002, serve: dict | None = None, **config) -> ServerThread:
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=step_time)))
    engine = make_engine(EngineConfig(**config), executor)
    return ServerThread(engine, ServeConfig(**(serve or {})))


def alone(prompt: list[int], max_tokens: int) -> list[int]:
    """The tokens the engine gives this request when it runs alone (virtual clock, no server)."""
    engine = Engine(EngineConfig(), SimulatedExecutor(make_cost_model("steps")), plugins=[ContentTokens()])
    out = engine.generate([Request(request_id="r", prompt_token_ids=prompt,
                                   sampling=SamplingParams(max_new_tokens=max_tokens, temperature=0))])
    return out["r"][0].output_token_ids


def ids(text: str) -> list[int]:
    """The stand-in tokens of a simulated output text (each rendered as ` <id>`)."""
    return [int(t) for t in text.split()]


def chat_prompt(content: str) -> list[int]:
    return TOK.chat_prompt([("user", content)])


def all_free_or_evictable(engine: Engine) -> None:
    assert not engine.has_unfinished()
    engine.pool.check_invariants([])
    assert engine.pool.num_used_blocks() == 0


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text) for s in fam.samples
    }


def test_the_openai_client_streams_a_chat_completion():
    openai = pytest.importorskip("openai")
    with sim_server() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=30)
        chunks = list(client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "Name a metro line."}],
            max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True},
        ))
        models = client.models.list()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert ids(text) == alone(chat_prompt("Name a metro line."), 12)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(chat_prompt("Name a metro line.")), 12)
    assert [m.id for m in models.data] == ["sim"]
    all_free_or_evictable(srv.engine)


async def _stream(client: httpx.AsyncClient, url: str, body: dict, stop_after: int | None = None,
                  headers: dict | None = None) -> tuple[int, str, str | None]:
    """(status, text, finish_reason) of one streamed completion; `stop_after` chunks then hang up."""
    text, reason, seen = "", None, 0
    async with client.stream("POST", url, json={**body, "stream": True}, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, r.text, None
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += choice["delta"].get("content", "")
            reason = choice["finish_reason"] or reason
            seen += 1
            if stop_after is not None and seen >= stop_after:
                return 200, text, "hung up"
    return 200, text, reason


def test_64_streams_with_a_fifth_hanging_up_complete_as_alone_and_free_every_block():
    rng = random.Random(7)
    bodies = [
        {"messages": [{"role": "user", "content": f"question {i} " + "x" * rng.randrange(0, 40)}],
         "max_tokens": 400 if i % 5 == 0 else rng.randrange(4, 40), "temperature": 0}
        for i in range(64)
    ]
    # a small pool: 64 requests of up to ~100 tokens in 160 blocks of 16 preempt one another
    with sim_server(step_time=0.001, num_blocks=160, max_num_seqs=32) as srv:
        async def main():
            async with httpx.AsyncClient(timeout=60) as client:
                url = srv.url + "/v1/chat/completions"
                return await asyncio.gather(*(
                    _stream(client, url, b, stop_after=3 if i % 5 == 0 else None) for i, b in enumerate(bodies)
                ))
        results = asyncio.run(main())
        for _ in range(500):  # the loop frees the hung-up requests' blocks at its next steps
            if not srv.engine.has_unfinished():
                break
            asyncio.run(asyncio.sleep(0.01))
        all_free_or_evictable(srv.engine)
        m = metrics(srv.url)
    hung_up = [i for i in range(64) if i % 5 == 0]
    for i, (status, text, reason) in enumerate(results):
        assert status == 200
        if i in hung_up:
            assert reason == "hung up"
            continue
        prompt = chat_prompt(bodies[i]["messages"][0]["content"])
        assert (ids(text), reason) == (alone(prompt, bodies[i]["max_tokens"]), "length"), i
    assert m[("metroline_requests_finished_total", (("reason", "cancelled"), ("tenant", "default")))] == len(hung_up)
    assert m[("metroline_requests_finished_total", (("reason", "length"), ("tenant", "default")))] == 64 - len(hung_up)
    served = m[("metroline_tokens_served_total", (("tenant", "default"),))]
    assert served >= sum(b["max_tokens"] for i, b in enumerate(bodies) if i not in hung_up) + 3 * len(hung_up)
