"""`metroline serve --replicas N` / `--pools`: a front routing one OpenAI endpoint over replica
servers, each a real process (spawned) running today's single-engine server. The openai client
through the front gets what a single server gives; a replica killed mid-stream fails its own
requests with one clear error while the others finish and new requests go to the survivor, whose
blocks all come back; length pools route by prompt length; Ray actors serve as replicas too."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from test_serve import metrics, sim_server  # noqa: E402

from metroline.cli import build_parser  # noqa: E402
from metroline.core.cluster.view import RouteRequest  # noqa: E402
from metroline.core.commands.serve import front_setup  # noqa: E402
from metroline.core.serving.front import REPLICA_HEADER  # noqa: E402
from metroline.core.serving.server import AppThread  # noqa: E402

SIM = ["--cost-model", "steps", "--step-time", "0.002"]


def start_front(*flags: str) -> AppThread:
    """`metroline serve FLAGS`'s front, started in a thread on a free port (its replicas spawned)."""
    app, _ = front_setup(build_parser().parse_args(["serve", *flags]), start_timeout=120)
    return AppThread(app).start()


def routed(url: str) -> dict[str, float]:
    """replica -> requests the front routed there (its /metrics)."""
    m = metrics(url)
    return {dict(labels)["replica"]: v for (name, labels), v in m.items()
            if name == "metroline_front_requests_routed_total"}


def replica_states(url: str) -> dict[str, dict]:
    return {r["name"]: r for r in httpx.get(url + "/v1/replicas").json()["replicas"]}


def wait_idle(url: str, name: str, timeout: float = 30.0) -> dict:
    """A replica's own state once it runs and queues nothing."""
    deadline = time.monotonic() + timeout
    while True:
        state = replica_states(url)[name]["state"]
        if state.get("num_running") == 0 and state.get("num_waiting") == 0 and state.get("in_flight") == 0:
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.1)


@pytest.fixture(scope="module")
def sim_front():
    front = start_front("--replicas", "2", *SIM)
    yield front
    replicas = front.app.state.front.replicas
    front.stop()
    assert not any(r.is_alive() for r in replicas)  # stopped with the front: no orphan


def test_the_openai_client_through_the_front_gets_what_one_server_gives(sim_front):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=sim_front.url + "/v1", api_key="none", max_retries=0, timeout=30)
    prompts = [f"a prompt to route, number {i}" for i in range(4)]
    messages = [[{"role": "user", "content": f"Name metro line {i}."}] for i in range(4)]

    def ask(c):
        out = []
        for i, prompt in enumerate(prompts):
            out.append(c.completions.create(model="sim", prompt=prompt, max_tokens=6 + i, temperature=0)
                       .choices[0].text)
            chunks = list(c.completions.create(model="sim", prompt=prompt, max_tokens=6 + i, stream=True))
            out.append("".join(ch.choices[0].text for ch in chunks if ch.choices))
        for i, m in enumerate(messages):
            out.append(c.chat.completions.create(model="sim", messages=m, max_tokens=5 + i)
                       .choices[0].message.content)
            chunks = list(c.chat.completions.create(model="sim", messages=m, max_tokens=5 + i, stream=True,
                                                    stream_options={"include_usage": True}))
            out.append("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices))
            assert chunks[-1].usage.completion_tokens == 5 + i
        return out

    before = routed(sim_front.url)
    through_front = ask(client)
    with sim_server() as single:  # the same requests on one server: stand-in tokens depend on them only
        alone = ask(openai.OpenAI(base_url=single.url + "/v1", api_key="none", max_retries=0, timeout=30))
    assert through_front == alone
    assert all(text.strip() for text in through_front)
    after = routed(sim_front.url)
    assert {k: after[k] - before.get(k, 0) for k in after} == {"r0": 8, "r1": 8}  # round robin: half each
    assert [m.id for m in client.models.list().data] == ["sim"]
    assert httpx.get(sim_front.url + "/health").json() == {"status": "ok", "replicas": {"r0": True, "r1": True}}
    for name in ("r0", "r1"):  # each replica's engine did its share, and its blocks all came back
        state = wait_idle(sim_front.url, name)
        assert state["kv_used_blocks"] == 0 and state["steps"] > 0
        own = httpx.get(f"{sim_front.url}/replicas/{name}/metrics").text
        assert "metroline_requests_finished_total" in own


def test_the_front_answers_bad_requests_itself_and_names_replicas(sim_front):
    r = httpx.post(sim_front.url + "/v1/completions", content=b"{not json")
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = httpx.post(sim_front.url + "/v1/chat/completions", json={"messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages")
    r = httpx.post(sim_front.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 200 and r.headers[REPLICA_HEADER] in ("r0", "r1")
    # a replica's own refusal passes through unchanged (the simulated executor has no logprobs)
    r = httpx.post(sim_front.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "logprobs": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    assert httpx.get(sim_front.url + "/replicas/r9/metrics").status_code == 404


def test_length_pools_send_long_prompts_to_the_long_pool_and_stop_with_the_front():
    front = start_front("--pools", "short=1,long=1", "--router", "length_pools", "--router-option",
                        "threshold=64", *SIM)
    try:
        short = httpx.post(front.url + "/v1/completions", json={"prompt": "short", "max_tokens": 3})
        long = httpx.post(front.url + "/v1/completions", json={"prompt": "x" * 200, "max_tokens": 3})
        chat = httpx.post(front.url + "/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "y" * 300}], "max_tokens": 3})
        assert [r.status_code for r in (short, long, chat)] == [200, 200, 200]
        assert [r.headers[REPLICA_HEADER] for r in (short, long, chat)] == ["short-0", "long-0", "long-0"]
        m = metrics(front.url)
        assert m[("metroline_front_requests_routed_total", (("pool", "short"), ("replica", "short-0")))] == 1
        assert m[("metroline_front_requests_routed_total", (("pool", "long"), ("replica", "long-0")))] == 2
        assert m[("metroline_front_e2e_seconds_count", (("pool", "long"), ("replica", "long-0")))] == 2
        replicas = front.app.state.front.replicas
    finally:
        front.stop()
    assert not any(r.is_alive() for r in replicas)


def test_a_sim_replica_killed_leaves_the_front_on_the_survivor_and_503_without_any():
    front = start_front("--replicas", "2", *SIM)
    try:
        handles = front.app.state.front.replicas
        # a plain (not streamed) request in flight on r0 (round robin's first) when r0 is killed: 502
        answer = {}
        waiter = threading.Thread(target=lambda: answer.update(r=httpx.post(
            front.url + "/v1/completions", json={"prompt": "long", "max_tokens": 3000}, timeout=60)))
        waiter.start()
        deadline = time.monotonic() + 20
        while replica_states(front.url)["r0"]["state"].get("num_running") != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(handles[0].pid, signal.SIGKILL)
        handles[0].process.join(5)
        waiter.join(30)
        assert answer["r"].status_code == 502
        assert answer["r"].json()["error"] == {
            "message": "replica r0 failed: connection lost (process killed by SIGKILL)", "type": "server_error",
            "param": None, "code": None}
        for _ in range(3):  # routed among the live ones only (the refused connection is routed again)
            r = httpx.post(front.url + "/v1/completions", json={"prompt": "after", "max_tokens": 2})
            assert (r.status_code, r.headers[REPLICA_HEADER]) == (200, "r1")
        assert httpx.get(front.url + "/health").json()["replicas"] == {"r0": False, "r1": True}
        route = front.app.state.front._chooser(RouteRequest("q", 0.0, [1, 2], 2), None)
        assert json.loads(route({1}).body)["error"]["message"] == "no other replica is up"  # r1 lives on
        os.kill(handles[1].pid, signal.SIGKILL)
        handles[1].process.join(5)
        # the dead r1 found at dispatch or by a poll, whichever comes first: no replica at all
        r = httpx.post(front.url + "/v1/completions", json={"prompt": "none left", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["message"] == "no replica is up"
        assert httpx.get(front.url + "/health").status_code == 503
        m = metrics(front.url)
        assert m[("metroline_front_replica_up", (("pool", "default"), ("replica", "r0")))] == 0
    finally:
        front.stop()


def test_the_remote_view_reads_the_polled_state_and_estimates_prefix_hits_from_what_was_routed():
    from metroline.core.cluster.view import RouteRequest
    from metroline.core.serving.remote_view import RemoteView

    view = RemoteView(3, "r3", "long", prefix_capacity=4)
    view.update({"num_waiting": 2, "num_running": 5, "kv_used_blocks": 7, "kv_free_blocks": 9, "block_size": 4,
                 "policy": "srpt"})
    assert (view.num_waiting, view.num_running, view.kv_used_blocks, view.kv_free_blocks, view.policy) == (
        2, 5, 7, 9, "srpt")
    first = RouteRequest("a", 0.0, list(range(13)), 8)
    assert view.prefix_hit(first) == 0
    view.routed(first)  # 3 full blocks of 4 (the last prompt token never counts)
    view.outstanding.add("a", 21)
    assert (view.outstanding_requests, view.outstanding_tokens) == (1, 21)
    assert view.prefix_hit(RouteRequest("b", 0.0, [*range(8), 99, 99, 99, 99, 99], 8)) == 8  # 2 blocks shared
    assert view.prefix_hit_at_least(RouteRequest("c", 0.0, [*range(8), 99, 99, 99, 99, 99], 8), 9) == 0
    assert view.prefix_hit_at_least(first, 12) == 12 and view.prefix_hit_at_least(first, 13) == 0
    # the views of one front share its directory: what was routed to one is no hit on the other
    other = RemoteView(4, "r4", "long", prefix_directory=view.prefix_directory)
    assert other.prefix_bit != view.prefix_bit and other.prefix_hit(first) == 0
    view.forget_prefixes()  # down (it may come back with an empty cache): nothing routed before counts
    assert view.prefix_hit(first) == 0


# --- a real model: a replica killed mid-stream ------------------------------------------------------

async def _stream(client: httpx.AsyncClient, url: str, body: dict, started: asyncio.Event) -> tuple[str, str, list]:
    """(replica, text, error messages) of one streamed completion; `started` is set at its first chunk."""
    text, errors, replica = "", [], ""
    async with client.stream("POST", url, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        replica = r.headers[REPLICA_HEADER]
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                errors.append(event["error"]["message"])
                continue
            text += event["choices"][0]["text"]
            started.set()
    return replica, text, errors


@pytest.mark.slow
def test_a_torch_replica_killed_mid_stream_fails_only_its_requests(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_serve import ids
    from torch_helpers import VOCAB, tiny_llama

    from metroline.core.config import EngineConfig
    from metroline.core.requests.request import Request, SamplingParams
    from metroline.core.step.engine import Engine
    from metroline.executors.torch import TorchExecutor

    model = tiny_llama(seed=3)
    model.save_pretrained(tmp_path / "tiny")
    prompts = [[(7 * i + 3 * j) % VOCAB for j in range(12 + i)] for i in range(6)]
    front = start_front("--replicas", "2", "--executor", "torch", "--model", str(tmp_path / "tiny"),
                        "--device", "cpu", "--num-blocks", "256", "--max-model-len", "512")
    try:
        url = front.url + "/v1/completions"

        async def main():
            async with httpx.AsyncClient(timeout=120) as client:
                tasks = []
                for p in prompts:  # one by one, so that round robin alternates r0, r1, r0, ...
                    started = asyncio.Event()
                    tasks.append(asyncio.create_task(_stream(
                        client, url, {"prompt": p, "max_tokens": 400, "temperature": 0}, started)))
                    await asyncio.wait_for(started.wait(), 60)
                os.kill(front.app.state.front.replicas[1].pid, signal.SIGKILL)
                return await asyncio.gather(*tasks)

        results = asyncio.run(main())
        assert [r for r, _, _ in results] == ["r0", "r1"] * 3
        for i, (replica, text, errors) in enumerate(results):
            if replica == "r1":  # killed mid-stream: the clear error, after the tokens it had sent
                assert len(errors) == 1 and errors[0].startswith("replica r1 failed: connection lost"), errors
                assert "SIGKILL" in errors[0]
            else:
                assert errors == []
                engine = Engine(EngineConfig(), TorchExecutor(model))
                out = engine.generate([Request(request_id="r", prompt_token_ids=prompts[i],
                                               sampling=SamplingParams(max_new_tokens=400, temperature=0.0))])
                assert ids(text) == out["r"][0].output_token_ids, i
        for p in prompts[:3]:  # new requests: all to the survivor, all served
            r = httpx.post(url, json={"prompt": p, "max_tokens": 8, "temperature": 0}, timeout=60)
            assert (r.status_code, r.headers[REPLICA_HEADER]) == (200, "r0")
        openai = pytest.importorskip("openai")  # the official client streams through the front, from the survivor
        client = openai.OpenAI(base_url=front.url + "/v1", api_key="none", max_retries=0, timeout=60)
        chunks = list(client.completions.create(model=str(tmp_path / "tiny"), prompt=prompts[4], max_tokens=8,
                                                temperature=0, stream=True))
        greedy = Engine(EngineConfig(), TorchExecutor(model)).generate([Request(
            request_id="g", prompt_token_ids=prompts[4], sampling=SamplingParams(max_new_tokens=8, temperature=0.0))])
        assert ids("".join(c.choices[0].text for c in chunks if c.choices)) == greedy["g"][0].output_token_ids
        m = metrics(front.url)
        assert m[("metroline_front_requests_failed_total", (("pool", "default"), ("replica", "r1")))] == 3
        assert m[("metroline_front_replica_up", (("pool", "default"), ("replica", "r1")))] == 0
        assert m[("metroline_front_requests_in_flight", (("pool", "default"), ("replica", "r0")))] == 0
        state = wait_idle(front.url, "r0")
        assert state["kv_used_blocks"] == 0  # no block held once idle: none leaked
        assert state["kv_free_blocks"] == state["num_blocks"]  # every block free or evictable
    finally:
        front.stop()


@pytest.mark.slow
def test_ray_actors_serve_as_replicas():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        front = start_front("--replicas", "2", "--ray", *SIM)
        try:
            handles = front.app.state.front.replicas
            assert [h.kind for h in handles] == ["ray", "ray"]
            served = set()
            for i in range(4):
                r = httpx.post(front.url + "/v1/chat/completions", timeout=30,
                               json={"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 3})
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
                served.add(r.headers[REPLICA_HEADER])
            assert served == {"r0", "r1"}
        finally:
            front.stop()
        assert all(not h.is_alive() for h in handles)
    finally:
        ray.shutdown()


class _Handle:
    """A replica process that lives (what `Health` asks of one)."""

    kind = "thread"

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def is_alive(self) -> bool:
        return True

    def why_down(self) -> str | None:
        return None


class _Answered:
    """What `Proxy.dispatch` returns of a replica that answered: its status."""

    status = 200


def _proxy(timeouts: int) -> tuple[object, list, list[int]]:
    """A `Proxy` over two live replicas whose first `timeouts` connections time out (a client that
    raises aiohttp's connect timeout, or answers 200, without a network); (proxy, views, ports asked
    in order)."""
    import aiohttp

    from metroline.core.serving.front_health import Health
    from metroline.core.serving.front_metrics import FrontMetrics
    from metroline.core.serving.front_proxy import Proxy
    from metroline.core.serving.remote_view import RemoteView

    asked: list[int] = []

    class Client:
        async def post(self, url: str, data: bytes, headers: dict) -> _Answered:
            asked.append(int(url.rpartition(":")[2].partition("/")[0]))
            if len(asked) <= timeouts:
                raise aiohttp.ConnectionTimeoutError("the replica's accept queue is full")
            return _Answered()

    views = [RemoteView(i, f"r{i}", "default") for i in range(2)]
    health = Health([_Handle(9000 + i) for i in range(2)], views, FrontMetrics([(v.name, v.pool) for v in views]),
                    1.0, 3.0, 0.05, lambda view, reason: None)
    proxy = Proxy(health, health.metrics, None)
    proxy.client = Client()
    return proxy, views, asked


def _first_untried(health):
    def route(tried):
        return next((v for v in health.live() if v.slot not in tried), "no other replica is up")
    return route


def test_a_request_no_busy_replica_took_is_tried_on_all_again_and_never_marks_one_down():
    """Connect timeouts on both live replicas (a connect storm): the front tries them all again
    after a pause instead of answering 503 "no other replica is up"; the third try is taken."""
    from metroline.core.cluster.view import RouteRequest

    proxy, views, asked = _proxy(timeouts=3)
    request = RouteRequest("q", 0.0, [1, 2, 3], 4)
    view, upstream = asyncio.run(proxy.dispatch(_first_untried(proxy.health), request, 7, "/v1/completions", b"{}", {}))
    assert asked == [9000, 9001, 9000, 9001] and view is views[1] and upstream.status == 200
    assert all(v.up for v in views) and views[0].outstanding_requests == 0 and views[1].outstanding_requests == 1


def test_live_replicas_that_never_take_a_request_answer_503_not_502():
    from metroline.core.cluster.view import RouteRequest
    from metroline.core.serving.front_proxy import MAX_ATTEMPTS, Failed

    proxy, views, asked = _proxy(timeouts=10**6)
    with pytest.raises(Failed, match="no replica took the request in 3 tries each") as exc:
        asyncio.run(proxy.dispatch(_first_untried(proxy.health), RouteRequest("q", 0.0, [1, 2], 4), 6,
                                   "/v1/completions", b"{}", {}))
    assert exc.value.status == 503 and len(asked) == MAX_ATTEMPTS * 2 and all(v.up for v in views)
    assert all(v.outstanding_requests == 0 for v in views)
