"""One tenant cannot hurt another, attacked over HTTP: a server on a loopback port (bound to port 0
by the server itself) and real clients. A plugin that raises for tenant A's requests, under each
shipped policy, and a 400-digit `priority` under `priority`, fail A's requests only while B's
concurrent streams complete whole with the tokens they get alone; a client that hangs up on a
non-streamed request (one prompt or a batch) has it cancelled and its blocks freed; a batch that
could never be queued whole is refused as too large; numbers and strings no field can hold answer
400 naming the field.

Every verdict is a status, a text or a count; the waits are bounded loops, never a timing."""

from __future__ import annotations

import json
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from test_serve import alone  # noqa: E402

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.plugins.hookspecs import hookimpl  # noqa: E402
from metroline.core.serving.server import ServerThread, make_engine  # noqa: E402
from metroline.core.serving.tenants import ServeConfig  # noqa: E402
from metroline.executors.cost_models import make_cost_model  # noqa: E402
from metroline.executors.realtime import RealtimeExecutor  # noqa: E402
from metroline.executors.simulated import SimulatedExecutor  # noqa: E402

KEYS = {"A": "sk-tenant-a", "B": "sk-tenant-b"}
OPERATOR = {"Authorization": "Bearer sk-operator"}
POLICIES = ["fcfs", "static", "priority", "srpt", "weighted_fair", "token_rr"]


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


class RaisesForA:
    """Raises in `on_arrival` for tenant A's requests only."""

    name = "raises_for_a"

    @hookimpl
    def on_arrival(self, seqs):
        if any(s.tenant == "A" for s in seqs):
            raise ValueError("tenant A is not welcome")


def server(policy: str = "fcfs", plugins=(), step_time: float = 0.002, **serve) -> ServerThread:
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=step_time)))
    engine = make_engine(EngineConfig(policy=policy, max_num_seqs=16), executor, list(plugins))
    tenants = {name: {"api_keys": [key]} for name, key in KEYS.items()}
    return ServerThread(engine, ServeConfig(tenants=tenants, **{"public_metrics": True,
                                                              "operator_keys": ["sk-operator"], **serve}))


class Stream:
    """A streamed completion of tenant B read in a thread: its data lines."""

    def __init__(self, url: str, prompt: str, max_tokens: int) -> None:
        self.prompt, self.max_tokens = prompt, max_tokens
        self.lines: list[str] = []
        self.status = 0
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0}
        self._thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict) -> None:
        with httpx.stream("POST", url + "/v1/completions", json=body, headers=auth("B"), timeout=120) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.lines.append(line[6:])

    def wait_started(self) -> None:
        deadline = time.monotonic() + 60
        while not self.lines and self._thread.is_alive():
            assert time.monotonic() < deadline, "no first token"
            time.sleep(0.01)

    def assert_whole(self) -> None:
        """It ended with `[DONE]`, no error, and the tokens this prompt gets alone."""
        self._thread.join(120)
        assert self.status == 200 and self.lines and self.lines[-1] == "[DONE]", (self.status, self.lines[-3:])
        events = [json.loads(x) for x in self.lines[:-1]]
        assert not [e for e in events if "error" in e], [e for e in events if "error" in e]
        text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
        assert [int(t) for t in text.split()] == alone(list(self.prompt.encode()), self.max_tokens)


def wait_idle(srv: ServerThread, timeout: float = 30.0) -> None:
    """Until the engine holds no request and no block (bounded)."""
    engine = srv.engine
    deadline = time.monotonic() + timeout
    while True:
        state = httpx.get(srv.url + "/v1/replica/state", headers=OPERATOR, timeout=10).json()
        if state["in_flight"] == 0 and state["num_running"] == 0 and state["num_waiting"] == 0:
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.02)
    engine.pool.check_invariants([])
    assert engine.pool.num_used_blocks() == 0


# --- failures scoped to their cause -------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_a_plugin_raising_for_tenant_a_fails_as_requests_only_and_bs_streams_complete(policy):
    with server(policy, [RaisesForA()]) as srv:
        streams = [Stream(srv.url, f"tenant B's stream number {i}", 80) for i in range(6)]
        for s in streams:
            s.wait_started()
        answers = [httpx.post(srv.url + "/v1/completions", headers=auth("A"), timeout=60,
                              json={"prompt": f"tenant A asks {i}", "max_tokens": 5}) for i in range(3)]
        with httpx.stream("POST", srv.url + "/v1/completions", headers=auth("A"), timeout=60,
                          json={"prompt": "tenant A streams", "max_tokens": 5, "stream": True}) as r:
            a_stream = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        later = Stream(srv.url, "tenant B comes after", 20)
        for s in [*streams, later]:
            s.assert_whole()
        for r in answers:
            message = r.json()["error"]["message"]
            assert r.status_code == 500, r.text
            assert "plugin 'raises_for_a', hook 'on_arrival', request '" in message, message
            assert "raised ValueError: tenant A is not welcome" in message
        assert a_stream[-1] == "[DONE]" and "tenant A is not welcome" in json.loads(a_stream[-2])["error"]["message"]
        errors = {k: v for k, v in _metrics(srv.url).items() if k[0] == "metroline_plugin_errors_total"}
        assert errors == {("metroline_plugin_errors_total", (("hook", "on_arrival"), ("plugin", "raises_for_a"))): 4.0}
        wait_idle(srv)


def _metrics(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_a_400_digit_priority_is_refused_naming_the_field_and_bs_streams_complete():
    """The attack that once failed every tenant's streams under `priority` (an overflow to float)."""
    with server("priority") as srv:
        streams = [Stream(srv.url, f"B under priority {i}", 60) for i in range(6)]
        for s in streams:
            s.wait_started()
        for value, limit in (("9" * 400, "2147483647"), ("-" + "9" * 400, "-2147483648"), (str(2**31), "2147483647"),
                             ("9" * 5000, "5000 digits")):
            raw = '{"prompt": "A\'s huge priority", "max_tokens": 4, "priority": %s}' % value
            r = httpx.post(srv.url + "/v1/completions", content=raw.encode(), timeout=60,
                           headers={**auth("A"), "content-type": "application/json"})
            assert (r.status_code, r.json()["error"]["param"]) == (400, "priority"), r.text
            assert limit in r.json()["error"]["message"], r.text
        for s in streams:
            s.assert_whole()
        wait_idle(srv)


# --- bad numbers and strings: 400 naming the field ----------------------------------------------


BAD_BODIES = [  # (path, raw body, the param the 400 names, a phrase of its message)
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 4, "deadline_s": Infinity}', "deadline_s", "finite"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 4, "deadline_s": 1e400}', "deadline_s", "finite"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 4, "deadline_s": 1e12}', "deadline_s", "31536000"),
    ("/v1/completions", b'{"prompt": "hi", "seed": ' + b"7" * 5000 + b"}", "seed", "5000 digits"),
    ("/v1/completions", b'{"prompt": [1, ' + b"2" * 4400 + b"]}", "prompt.1", "4400 digits"),
    ("/v1/completions", b'{"prompt": "hi", "expected_output_tokens": 4294967296}', "expected_output_tokens",
     "2147483647"),
    ("/v1/completions", b'{"prompt": "a lone \\ud800 surrogate"}', "prompt", "lone UTF-16 surrogate"),
    ("/v1/completions", b'{"prompt": "hi", "stop": ["\\udfff"]}', "stop.0", "lone UTF-16 surrogate"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x\\uDBFF"}]}', "messages.0.content",
     "lone UTF-16 surrogate"),
]


def test_numbers_and_strings_no_field_can_hold_answer_400_naming_the_field():
    with server() as srv:
        stream = Stream(srv.url, "B goes on meanwhile", 40)
        for path, raw, param, phrase in BAD_BODIES:
            r = httpx.post(srv.url + path, content=raw, timeout=60,
                           headers={**auth("A"), "content-type": "application/json"})
            assert r.status_code == 400, (raw[:60], r.status_code, r.text)
            error = r.json()["error"]
            assert error["param"] == param and phrase in error["message"], (raw[:60], error)
        # a surrogate pair is one character: served
        r = httpx.post(srv.url + "/v1/completions", content=b'{"prompt": "\\ud83d\\ude00", "max_tokens": 2}',
                       headers={**auth("A"), "content-type": "application/json"}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 4  # its 4 UTF-8 bytes
        stream.assert_whole()


# --- every hang-up cancels; the waiting queue is bounded ----------------------------------------


@pytest.mark.parametrize("prompt", ["one long answer", ["a batch", "of three", "long answers"]],
                         ids=["single", "batch"])
def test_a_client_that_hangs_up_on_a_non_streamed_request_has_it_cancelled(prompt):
    with server(step_time=0.005) as srv:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            httpx.post(srv.url + "/v1/completions", headers=auth("A"), timeout=httpx.Timeout(60, read=0.5),
                       json={"prompt": prompt, "max_tokens": 3000, "ignore_eos": True})
        # 3,000 tokens at 5 ms a step run for 15 s; cancelled, the engine is idle long before
        wait_idle(srv, timeout=10)
        finished = _finished(srv.url)
        assert finished == {"cancelled": len(prompt) if isinstance(prompt, list) else 1}, finished


def _finished(url: str) -> dict[str, float]:
    return {dict(labels)["reason"]: v for (name, labels), v in _metrics(url).items()
            if name == "metroline_requests_finished_total" and dict(labels)["tenant"] == "A"}


def test_a_batch_larger_than_the_waiting_queue_is_refused_as_too_large_not_429():
    with server(max_waiting=8) as srv:
        r = httpx.post(srv.url + "/v1/completions", headers=auth("A"), timeout=60,
                       json={"prompt": [f"p{i}" for i in range(9)], "max_tokens": 2})
        assert r.status_code == 413 and "retry-after" not in r.headers, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("prompt", "batch_too_large")
        assert "a batch of 9 prompts" in error["message"] and "max_waiting=8" in error["message"]
        r = httpx.post(srv.url + "/v1/completions", headers=auth("A"), timeout=60,
                       json={"prompt": [f"p{i}" for i in range(8)], "max_tokens": 2})
        assert r.status_code == 200 and len(r.json()["choices"]) == 8


def test_the_waiting_queue_is_bounded_by_default():
    assert ServeConfig().max_waiting == 1024


# --- bounded heads, one Authorization; at a server and through the front -------------------------


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    """`metroline serve --replicas 2`'s front (replicas spawned), tenants A and B."""
    from test_serve_replicas import start_front

    config = tmp_path_factory.mktemp("front") / "serve.toml"
    config.write_text('[serve]\npublic_metrics = true\noperator_keys = ["sk-operator"]\n' + "".join(
        f'[serve.tenants.{name}]\napi_keys = ["{key}"]\n' for name, key in KEYS.items()))
    srv = start_front("--config", str(config), "--replicas", "2", "--cost-model", "steps", "--step-time", "0.005")
    yield srv
    srv.stop()


def _flood(port: int, fields: int, size: int) -> bytes:
    """Send a request head of `fields` headers of `size` bytes each, then read the answer (the
    server may close the connection while the head is still being sent)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            for i in range(fields):
                s.sendall(b"X-Flood-%d: " % i + b"a" * size + b"\r\n")
            s.sendall(b"Content-Length: 2\r\n\r\n{}")
        except OSError:
            pass  # refused and closed mid-head
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except OSError:
            pass
    return answer


def _header_attacks(url: str, port: int) -> None:
    stream = Stream(url, "B streams through the floods", 60)
    stream.wait_started()
    for fields, size, what in ((1, 40 << 20, b"over 65536 bytes"), (1000, 8, b"more than 100 header fields")):
        answer = _flood(port, fields, size)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert what in answer and b"request_header_fields_too_large" in answer, answer[-300:]
    r = httpx.post(url + "/v1/completions", json={"prompt": "who pays?", "max_tokens": 2}, timeout=60,
                   headers=[("Authorization", f"Bearer {KEYS['A']}"), ("Authorization", f"Bearer {KEYS['B']}")])
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("Authorization", "duplicate_header")
    assert "2 Authorization headers" in r.json()["error"]["message"]
    stream.assert_whole()
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_a_header_flood_and_two_authorization_headers_are_refused_at_a_server():
    with server() as srv:
        _header_attacks(srv.url, srv.port)


@pytest.mark.slow
def test_a_header_flood_and_two_authorization_headers_are_refused_at_the_front(front):
    _header_attacks(front.url, front.port)


@pytest.mark.slow
def test_a_client_that_hangs_up_on_the_front_has_its_non_streamed_request_cancelled_at_the_replica(front):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(front.url + "/v1/completions", headers=auth("A"), timeout=httpx.Timeout(60, read=1.0),
                   json={"prompt": ["a batch", "through the front"], "max_tokens": 3000, "ignore_eos": True})
    deadline = time.monotonic() + 10  # 3,000 tokens at 5 ms a step run for 15 s
    while True:
        states = [r["state"] for r in httpx.get(front.url + "/v1/replicas", timeout=10,
                                                headers={"Authorization": "Bearer sk-operator"}).json()["replicas"]]
        if all(s and s["num_running"] == 0 and s["num_waiting"] == 0 and s["in_flight"] == 0 for s in states):
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.05)
    assert all(s["kv_used_blocks"] == 0 for s in states), states


def test_a_request_larger_than_the_burst_is_refused_as_too_large_and_quota_refusals_count_under_the_tenant():
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.002)))
    config = EngineConfig(plugins=["tenant_quota"], plugin_options={"tenant_quota": {"token_rate": {"A": 0.001},
                                                                                     "burst": 50}})
    tenants = {name: {"api_keys": [key]} for name, key in KEYS.items()}
    with ServerThread(make_engine(config, executor), ServeConfig(tenants=tenants, public_metrics=True)) as srv:
        def ask(**body):
            return httpx.post(srv.url + "/v1/completions", headers=auth("A"), timeout=60,
                              json={"prompt": "within", "ignore_eos": True, **body})

        r = ask(max_tokens=100)  # 6 + 100 tokens: more than the bucket ever holds
        error = r.json()["error"]
        assert r.status_code == 400 and error["code"] == "request_too_large" and error["param"] == "max_tokens"
        assert "asks for 106 tokens (prompt 6 + max_tokens 100 x n 1)" in error["message"]
        assert "token-rate burst of 50 tokens" in error["message"]
        r = ask(max_tokens=10, n=3)  # 6 + 30: within the burst
        assert r.status_code == 200, r.text
        r = ask(max_tokens=10, n=3)  # the bucket holds 14 (+ 0.001 a second)
        assert r.status_code == 429 and "over its token-rate quota" in r.json()["error"]["message"], r.text
        rejections = {dict(labels)["tenant"]: v for (name, labels), v in _metrics(srv.url).items()
                      if name == "metroline_rejections_total" and dict(labels)["reason"] == "quota"}
        assert rejections == {"A": 2.0}


@pytest.fixture(scope="module")
def quota_front(tmp_path_factory):
    """`serve --replicas 2` (round robin) with tenant A's token rate: 200 tokens of burst, refilled
    at 0.001 a second (nothing refills within a test)."""
    from test_serve_replicas import start_front

    config = tmp_path_factory.mktemp("quota_front") / "serve.toml"
    config.write_text('max_model_len = 4096\nplugins = ["tenant_quota"]\n'
                      '[plugin_options.tenant_quota]\ntoken_rate = { A = 0.001 }\nburst = 200\n'
                      '[serve]\noperator_keys = ["sk-operator"]\n' + "".join(
                          f'[serve.tenants.{name}]\napi_keys = ["{key}"]\n' for name, key in KEYS.items()))
    srv = start_front("--config", str(config), "--replicas", "2", "--cost-model", "steps", "--step-time", "0.002")
    yield srv
    srv.stop()


@pytest.mark.slow
def test_a_tenants_token_quota_holds_once_across_replicas_at_the_front(quota_front):
    """One bucket for tenant A at the front, not one per replica: each request reserves 10 prompt
    tokens + 150; what a request did not use (one that stops at its first token) comes back, from
    the usage its replica reports (streamed: a comment the client never sees)."""
    from metroline.core.serving.front import REPLICA_HEADER

    url = quota_front.url + "/v1/completions"
    body = {"prompt": "p" * 10, "max_tokens": 150}
    with httpx.stream("POST", url, headers=auth("A"), timeout=60, json={**body, "stream": True, "stop": [" "]}) as r:
        lines = [line for line in r.iter_lines() if line]
        first = r.headers[REPLICA_HEADER]
    assert r.status_code == 200 and lines[-1] == "data: [DONE]", lines
    assert all(line.startswith("data: ") for line in lines), lines  # no usage comment reaches the client
    r = httpx.post(url, headers=auth("A"), timeout=60, json={**body, "stop": [" "]})  # 189 left: fits
    assert r.status_code == 200 and r.headers[REPLICA_HEADER] != first, r.text
    assert r.json()["usage"]["completion_tokens"] == 1
    r = httpx.post(url, headers=auth("A"), timeout=60, json={**body, "ignore_eos": True})  # 178 left: uses all
    assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == 160, r.text
    r = httpx.post(url, headers=auth("A"), timeout=60, json={**body, "ignore_eos": True})  # 18 left
    assert r.status_code == 429 and "over its token-rate quota" in r.json()["error"]["message"], r.text
    assert REPLICA_HEADER not in r.headers  # the front's refusal: no replica saw it
    r = httpx.post(url, headers=auth("B"), timeout=60, json={**body, "ignore_eos": True})  # B has no rate
    assert r.status_code == 200, r.text
    r = httpx.post(url, headers=auth("A"), timeout=60, json={**body, "max_tokens": 500})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "request_too_large" and error["param"] == "max_tokens"
    assert "more than tenant 'A''s token-rate burst of 200 tokens" in error["message"], error


@pytest.mark.slow
def test_the_front_refuses_a_batch_larger_than_the_waiting_queue_itself(front):
    from metroline.core.serving.front import REPLICA_HEADER

    r = httpx.post(front.url + "/v1/completions", headers=auth("A"), timeout=60,
                   json={"prompt": [f"p{i}" for i in range(1025)], "max_tokens": 2})
    assert r.status_code == 413 and REPLICA_HEADER not in r.headers, r.text  # no replica saw it
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("batch_too_large", "prompt")
    assert "a batch of 1025 prompts" in r.json()["error"]["message"] and "max_waiting=1024" in r.json()["error"]["message"]


def test_the_replica_state_is_an_operators_page_where_tenants_are_configured():
    """`/v1/replica/state` (every tenant's load) answers 401 without a key and to a tenant's key,
    200 to an operator's; the front reads it with a key of its own (its tests route through it)."""
    with server() as srv:
        url = srv.url + "/v1/replica/state"
        assert httpx.get(url, timeout=10).status_code == 401
        assert httpx.get(url, headers=auth("A"), timeout=10).status_code == 401
        r = httpx.get(url, headers=OPERATOR, timeout=10)
        assert r.status_code == 200 and r.json()["in_flight"] == 0


# --- slow readers bounded by their socket's bytes ------------------------------------------------


def test_a_client_that_reads_nothing_is_paused_by_its_sockets_bytes_and_cut_after_the_stall_timeout():
    """A raw socket (a small receive buffer) asks for a stream of 6,000 tokens and reads nothing.
    The token rule is out of reach (`buffer_tokens` 1,000,000), so only the bytes its socket holds
    (over 64 KiB: the transport's buffer and the kernel's send queue) pause it; paused past
    `stall_timeout` it is cancelled, its blocks freed, its connection reset, long before its
    6,000 tokens."""
    import socket

    with server(buffer_tokens=1_000_000, buffer_bytes=64 * 1024, stall_timeout=1.0) as srv:
        body = json.dumps({"prompt": "a reader that reads nothing", "max_tokens": 6000, "stream": True,
                           "ignore_eos": True}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEYS['A']}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            sock.connect(("127.0.0.1", srv.port))
            sock.sendall(head + body)
            deadline = time.monotonic() + 60
            while True:  # until the request has ended
                m = _metrics(srv.url)
                ended = {dict(labels)["reason"]: v for (name, labels), v in m.items()
                         if name == "metroline_requests_finished_total"}
                if ended:
                    break
                assert time.monotonic() < deadline, "the stream was never cut"
                time.sleep(0.05)
            assert ended == {"cancelled": 1.0}
            served = sum(v for (name, _), v in m.items() if name == "metroline_tokens_served_total")
            assert 0 < served < 6000
            health = httpx.get(srv.url + "/health", timeout=10).json()
            assert health["socket_pauses"] == 1 and health["paused"] == 0
            wait_idle(srv)
            sock.settimeout(30)
            with pytest.raises(ConnectionResetError):  # reset: whatever it held is dropped
                while sock.recv(1 << 16):
                    pass
        finally:
            sock.close()
