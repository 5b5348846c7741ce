"""`metroline serve` attacked and misused, as real processes on 127.0.0.1 (a single server and the
front of `--replicas 2`): refusals before reading, bad input answered 400, tenants unable to probe
each other through the router, quotas that hold under parallel requests, `n` and batches, a
frozen replica taken out of the rotation, and SIGTERM ending every stream with `[DONE]`.

The timings of these refusals (how fast, how long a concurrent stream waited) are printed by
`bench/serve_load.py --abuse`; here the behaviour is asserted: the status, what was (not) routed,
and that a concurrent stream went on and finished whole.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from metroline.core.serving.front import REPLICA_HEADER  # noqa: E402
from metroline.core.serving.schema_limits import schema_problem  # noqa: E402

import metroline  # noqa: E402

ROOT = Path(metroline.__file__).parent.parent
"""The folder `metroline` is imported from here (the servers these tests start import the same code,
not whatever an editable install points to)."""
HERE = Path(__file__).resolve().parent
KEYS = {"alpha": "sk-alpha", "beta": "sk-beta", "gamma": "sk-gamma"}
OPERATOR = "sk-operator"
CONFIG = f"""
max_model_len = 4096
[serve]
drain_s = 1.0
health_timeout_s = 0.3
down_after_s = 1.0
operator_keys = ["{OPERATOR}"]
[serve.tenants.alpha]
api_keys = ["{KEYS['alpha']}"]
[serve.tenants.beta]
api_keys = ["{KEYS['beta']}"]
[serve.tenants.gamma]
api_keys = ["{KEYS['gamma']}"]
[plugin_options.tenant_quota]
token_rate = {{ gamma = 1000 }}
burst = 1000
"""
CLUSTER = """
[cluster]
replicas = 2
router = "prefix_aware"
router_options = { load_bound = 2 }
"""
SIM = ["--cost-model", "steps", "--step-time", "0.002", "--plugin", "tenant_quota"]


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS.get(tenant, tenant)}"}


OP = {"Authorization": f"Bearer {OPERATOR}"}


class Served:
    """`metroline serve` in a process of its own on loopback port 0: the port the system gives it,
    which it says on stderr once bound (binding a free port here and handing it over would leave a
    window in which another process could take it); stderr kept."""

    def __init__(self, tmp: Path, cluster: bool, *flags: str) -> None:
        config = tmp / "serve.toml"
        config.write_text(CONFIG + (CLUSTER if cluster else ""))
        self.err = (tmp / "stderr.txt").open("w+")
        path = [str(ROOT), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]  # HERE: hang_plugins
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.proc = subprocess.Popen([sys.executable, "-m", "metroline", "serve", "--config", str(config), "--port",
                                      "0", *SIM, *flags], stderr=self.err, env=env)
        deadline = time.monotonic() + 120
        while (found := re.search(r"serving .* on http://127\.0\.0\.1:(\d+)", self.stderr())) is None:
            assert self.proc.poll() is None, self.stderr()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        self.port = int(found.group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        while True:
            assert self.proc.poll() is None, self.stderr()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)

    def stderr(self) -> str:
        return Path(self.err.name).read_text()  # its own offset: the server's writes go on at theirs

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    srv = Served(tmp_path_factory.mktemp("single"), False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    srv = Served(tmp_path_factory.mktemp("front"), True)
    yield srv
    srv.stop()


class Stream:
    """A streamed completion read in a thread: its data lines, the times they came."""

    def __init__(self, url: str, tenant: str = "alpha", max_tokens: int = 400, prompt: str = "a steady stream") -> None:
        self.lines: list[str] = []
        self.times: list[float] = []
        self.status = 0
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
        self._thread = threading.Thread(target=self._run, args=(url, body, auth(tenant)), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict, headers: dict) -> None:
        with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=60) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.lines.append(line[6:])
                    self.times.append(time.monotonic())

    def wait_started(self, n: int = 3) -> None:
        deadline = time.monotonic() + 30
        while len(self.lines) < n and self._thread.is_alive():
            assert time.monotonic() < deadline, self.lines
            time.sleep(0.01)

    def join(self) -> list[str]:
        self._thread.join(60)
        return self.lines

    def tokens(self) -> int:
        return sum(len(json.loads(x)["choices"][0]["text"].split()) for x in self.lines
                   if x.startswith("{") and json.loads(x).get("choices"))


def routed(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", headers=OP).text
    return {s.labels["replica"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "metroline_front_requests_routed_total"}


# --- refuse before reading ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["single", pytest.param("front", marks=pytest.mark.slow)])
def test_a_20mb_body_without_a_key_is_refused_unread_and_a_concurrent_stream_goes_on(where, request):
    srv = request.getfixturevalue(where)
    before = routed(srv.url) if where == "front" else None
    stream = Stream(srv.url)
    stream.wait_started()
    at = len(stream.lines)
    body = json.dumps({"prompt": "x" * (20 << 20), "max_tokens": 1}).encode()
    r = httpx.post(srv.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert REPLICA_HEADER not in r.headers
    # with a key: over max_body_bytes (16 MiB), refused from its Content-Length alone
    r = httpx.post(srv.url + "/v1/completions", content=body, headers={**auth("alpha"),
                   "content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert REPLICA_HEADER not in r.headers
    lines = stream.join()
    assert stream.status == 200 and lines[-1] == "[DONE]" and len(lines) > at
    assert stream.tokens() == 400  # whole, not cut
    if where == "front":  # nothing was routed but the stream
        after = routed(srv.url)
        assert sum(after.values()) - sum(before.values()) == 1


@pytest.mark.slow
def test_a_100mb_prompt_is_refused_by_its_length_before_it_is_read(single):
    stream = Stream(single.url)
    stream.wait_started()
    body = b'{"prompt": "' + b"y" * (100 << 20) + b'"}'
    r = httpx.post(single.url + "/v1/completions", content=body, headers={**auth("alpha"),
                   "content-type": "application/json"}, timeout=60)
    assert r.status_code == 413
    # under the body limit but over what any prompt of 4,096 tokens can be: characters, untokenized
    r = httpx.post(single.url + "/v1/completions", json={"prompt": "z" * 600_000}, headers=auth("alpha"))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "600000 characters" in r.json()["error"]["message"]
    assert stream.join()[-1] == "[DONE]" and stream.tokens() == 400


@pytest.mark.parametrize("where", ["single", pytest.param("front", marks=pytest.mark.slow)])
def test_malformed_bodies_answer_400_naming_the_field_never_500(where, request):
    url = request.getfixturevalue(where).url
    a = {**auth("alpha"), "content-type": "application/json"}
    chat = "/v1/chat/completions"

    def post(path: str, body: object) -> httpx.Response:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(url + path, content=raw, headers=a, timeout=30)

    r = post(chat, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages.0.content")
    r = post("/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    deep = '{"type": "object", "properties": {"a": ' * 2000 + '{"type": "string"}' + "}}" * 2000
    r = post(chat, ('{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", '
                    '"json_schema": {"name": "deep", "schema": ' + deep + "}}}").encode())
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    r = post("/v1/completions", {"prompt": "hi", "stop": [f"s{i}" for i in range(10_000)]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "stop")
    assert "at most 16 stop strings" in r.json()["error"]["message"]


def test_schema_limits_refuse_what_would_compile_for_seconds_or_recurse():
    assert schema_problem({"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}},
                           "$defs": {"x": {"type": "string"}}}) is None
    assert "5000 alternatives" in schema_problem({"anyOf": [{"type": "object"}] * 5000})
    cycle = {"$defs": {"x": {"anyOf": [{"$ref": "#/$defs/y"}]}, "y": {"properties": {"k": {"$ref": "#/$defs/x"}}}},
             "$ref": "#/$defs/x"}
    assert schema_problem(cycle).startswith("$ref cycle: #/$defs/x -> #/$defs/y -> #/$defs/x")
    deep: dict = {}
    for _ in range(2000):
        deep = {"properties": {"a": deep}}
    assert "nested more than" in schema_problem(deep)


# --- tenants ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tenant_cannot_learn_through_the_router_where_another_tenants_prompt_is(front):
    url = front.url
    secret = "the secret system prompt of tenant alpha " * 8
    other = "an unrelated prompt of just the same length " * 8
    other = other[:len(secret)]
    # alpha's prompt goes to r1 while a long stream keeps r0 busy (routed there first: a tie)
    busy = Stream(url, "beta", max_tokens=300, prompt="busy")
    busy.wait_started()
    a = httpx.post(url + "/v1/completions", json={"prompt": secret, "max_tokens": 2}, headers=auth("alpha"))
    assert a.headers[REPLICA_HEADER] == "r1"
    busy.join()
    # idle again: alpha's own repeat finds its prefix on r1; beta's copy of it is routed as any
    # other prompt of beta's (the tie: r0), and its replica's cache holds nothing of alpha's
    again = httpx.post(url + "/v1/completions", json={"prompt": secret, "max_tokens": 2}, headers=auth("alpha"))
    probe = httpx.post(url + "/v1/completions", json={"prompt": secret, "max_tokens": 2}, headers=auth("beta"))
    control = httpx.post(url + "/v1/completions", json={"prompt": other, "max_tokens": 2}, headers=auth("beta"))
    assert again.headers[REPLICA_HEADER] == "r1"
    assert probe.headers[REPLICA_HEADER] == control.headers[REPLICA_HEADER] == "r0"
    assert probe.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # no key, a wrong key: refused, nothing routed, no replica named
    for headers in ({}, {"Authorization": "Bearer sk-nope"}):
        r = httpx.post(url + "/v1/completions", json={"prompt": secret}, headers=headers)
        assert r.status_code == 401 and REPLICA_HEADER not in r.headers
    # the operator's pages: not a tenant's
    for path in ("/metrics", "/v1/replicas", "/replicas/r0/metrics"):
        assert httpx.get(url + path, headers=auth("alpha")).status_code == 401
        assert httpx.get(url + path, headers=OP).status_code == 200
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.get(url + "/v1/models", headers=auth("beta")).status_code == 200


@pytest.mark.parametrize("shape", ["parallel", "n", "batch"])
def test_the_token_quota_holds_within_its_burst_under_parallel_requests_n_and_batches(single, shape):
    """gamma: 1,000 tokens/s, burst 1,000. Each shape asks for far more than that at once."""
    import asyncio

    prompt = "q" * 10  # 10 stand-in tokens

    async def one(client: httpx.AsyncClient, body: dict) -> httpx.Response:
        return await client.post(single.url + "/v1/completions", json={**body, "ignore_eos": True},
                                 headers=auth("gamma"))

    async def burst() -> tuple[list[httpx.Response], float]:
        async with httpx.AsyncClient(timeout=60) as client:
            t0 = time.monotonic()
            if shape == "parallel":
                bodies = [{"prompt": prompt, "max_tokens": 50}] * 64
            elif shape == "n":
                bodies = [{"prompt": prompt, "max_tokens": 20, "n": 32}] * 8
            else:
                bodies = [{"prompt": [prompt] * 16, "max_tokens": 40}] * 8
            out = await asyncio.gather(*(one(client, b) for b in bodies))
            return out, time.monotonic() - t0

    time.sleep(1.1)  # the bucket full again after the other shapes
    answers, elapsed = asyncio.run(burst())
    ok = [r for r in answers if r.status_code == 200]
    limited = [r for r in answers if r.status_code == 429]
    assert ok and limited and len(ok) + len(limited) == len(answers)
    assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
    used = sum(r.json()["usage"]["total_tokens"] for r in ok)
    assert used <= 1000 + 1000 * elapsed, (used, elapsed)


# --- health and failover ------------------------------------------------------------------------


@pytest.mark.slow
def test_routing_is_recorded_at_dispatch_so_concurrent_requests_spread_within_the_load_bound(front):
    import asyncio

    before = routed(front.url)

    async def many() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(
                front.url + "/v1/completions", json={"prompt": "one shared prompt, many at once", "max_tokens": 60},
                headers=auth("alpha")) for _ in range(12)))

    answers = asyncio.run(many())
    assert all(r.status_code == 200 for r in answers)
    after = routed(front.url)
    counts = {k: after[k] - before.get(k, 0) for k in after}
    assert sum(counts.values()) == 12
    assert abs(counts["r0"] - counts["r1"]) <= 2 + 1, counts  # load_bound = 2


@pytest.mark.slow
def test_a_client_that_hangs_up_through_the_front_is_cancelled_at_the_replica(front):
    for _ in range(3):
        with httpx.stream("POST", front.url + "/v1/completions", headers=auth("alpha"), timeout=30,
                          json={"prompt": "hang up", "max_tokens": 400, "stream": True, "ignore_eos": True}) as r:
            next(r.iter_lines())
    deadline = time.monotonic() + 10
    while True:
        states = [s["state"] for s in httpx.get(front.url + "/v1/replicas", headers=OP).json()["replicas"]]
        if all(s and s["num_running"] == 0 and s["num_waiting"] == 0 for s in states):
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.05)


@pytest.mark.slow
def test_a_frozen_replica_is_marked_down_its_streams_ended_and_its_traffic_moved(front):
    url = front.url
    replicas = {r["name"]: r for r in httpx.get(url + "/v1/replicas", headers=OP).json()["replicas"]}
    pid = replicas["r1"]["pid"]
    busy = Stream(url, "beta", max_tokens=400, prompt="keeps r0 busy")  # r0: the tie
    busy.wait_started()
    victim = Stream(url, "beta", max_tokens=3000, prompt="a stream on r1")
    victim.wait_started()
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        while httpx.get(url + "/health").json()["replicas"]["r1"]:
            assert time.monotonic() - t0 < 10, "the frozen replica was not marked down"
            time.sleep(0.05)
        lines = victim.join()
        assert lines[-1] == "[DONE]" and "replica r1 failed: no answer to its health check" in json.loads(lines[-2])["error"]["message"]
        served = [httpx.post(url + "/v1/completions", json={"prompt": f"after {i}", "max_tokens": 2},
                             headers=auth("alpha"), timeout=10) for i in range(4)]
        assert [(r.status_code, r.headers[REPLICA_HEADER]) for r in served] == [(200, "r0")] * 4
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while not httpx.get(url + "/health").json()["replicas"]["r1"]:
        assert time.monotonic() < deadline, "the thawed replica was not marked up"
        time.sleep(0.05)
    busy.join()


# --- shutdown -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("cluster", [False, True], ids=["single", "front"])
def test_sigterm_ends_every_stream_with_a_last_event_and_done_without_a_traceback(tmp_path, cluster):
    srv = Served(tmp_path, cluster)
    try:
        streams = [Stream(srv.url, "alpha", max_tokens=3000, prompt=f"long {i}") for i in range(6)]
        streams += [Stream(srv.url, "beta", max_tokens=10, prompt=f"short {i}") for i in range(2)]
        for s in streams:
            s.wait_started(1)
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        code = srv.proc.wait(30)
        took = time.monotonic() - t0
    finally:
        srv.stop()
    for s in streams:
        lines = s.join()
        assert lines and lines[-1] == "[DONE]", lines[-3:]
    cut = [s for s in streams[:6] if "error" in json.loads(s.lines[-2])]
    assert all("cancelled" in json.loads(s.lines[-2])["error"]["message"] for s in cut)
    # uvicorn re-raises the SIGTERM it handled once shut down: the process ends by it, cleanly
    assert code in (0, -signal.SIGTERM) and took < 1.0 + 10
    err = srv.stderr()
    assert "Traceback" not in err and "CancelledError" not in err, err


# --- plugins watched: the hook budget, the process's memory ----------------------------------------


def metric_samples(url: str, name: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", headers=OP, timeout=10).text
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name]


@pytest.mark.slow
@pytest.mark.parametrize("plugin, hook", [("hang_plugins:HangsForAlpha", "on_arrival"),
                                          ("hang_plugins:SpinsForAlpha", "check_request")])
def test_a_plugin_that_hangs_for_one_tenant_is_stopped_at_the_hook_budget_and_fails_that_request_only(
        tmp_path, plugin, hook):
    """A plugin sleeping (or spinning) for an hour on alpha's requests: alpha's request fails with
    an error naming the plugin, the hook and the budget, counted in /metrics; beta's concurrent
    streams end whole with [DONE]; /health answers; the server's RSS is in /metrics."""
    srv = Served(tmp_path, False, "--plugin", plugin, "--hook-budget", "0.5")
    try:
        streams = [Stream(srv.url, "beta", 300, f"beta's stream {i}") for i in range(3)]
        for s in streams:
            s.wait_started()
        r = httpx.post(srv.url + "/v1/completions", headers=auth("alpha"), timeout=60,
                       json={"prompt": "alpha's request", "max_tokens": 5})
        assert r.status_code == 500, r.text
        name = plugin.split(":")[1]
        name = {"HangsForAlpha": "hangs_for_alpha", "SpinsForAlpha": "spins_for_alpha"}[name]
        message = r.json()["error"]["message"]
        assert f"plugin {name!r}, hook {hook!r}" in message and "over the hook budget of 0.5 s" in message
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
        for s in streams:
            lines = s.join()
            assert s.status == 200 and lines[-1] == "[DONE]" and s.tokens() == 300, lines[-3:]
        overruns = metric_samples(srv.url, "metroline_plugin_overruns_total")
        assert [(x.labels, x.value) for x in overruns] == [({"plugin": name, "hook": hook}, 1.0)]
        rss = metric_samples(srv.url, "process_resident_memory_bytes")
        assert len(rss) == 1 and rss[0].value > 0
        assert "over 0.5 s (hook_budget_s)" in srv.stderr()
    finally:
        srv.stop()
