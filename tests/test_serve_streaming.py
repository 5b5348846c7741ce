"""Streaming through the HTTP server: n > 1 choices with the openai client, and backpressure (a
client that stops reading is paused, holding its blocks, then resumed or, past the stall timeout,
cancelled)."""

from __future__ import annotations

import json
import re
import socket
import time

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.requests.request import Request, SamplingParams  # noqa: E402
from metroline.core.serving.server import ServerThread, make_engine  # noqa: E402
from metroline.core.serving.tenants import ServeConfig  # noqa: E402
from metroline.core.serving.tokens import ContentTokens, StandInTokenizer  # noqa: E402
from metroline.core.step.engine import Engine  # noqa: E402
from metroline.executors.cost_models import make_cost_model  # noqa: E402
from metroline.executors.realtime import RealtimeExecutor  # noqa: E402
from metroline.executors.simulated import SimulatedExecutor  # noqa: E402


def sim_server(step_time: float, serve: dict | None = None, **config) -> ServerThread:
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=step_time)))
    return ServerThread(make_engine(EngineConfig(**config), executor), ServeConfig(**(serve or {})))


def samples(prompt: list[int], max_tokens: int, n: int) -> list[list[int]]:
    """Each sample's tokens when the request runs alone (virtual clock, no server), by index."""
    engine = Engine(EngineConfig(), SimulatedExecutor(make_cost_model("steps")), plugins=[ContentTokens()])
    out = engine.generate([Request(request_id="r", prompt_token_ids=prompt,
                                   sampling=SamplingParams(max_new_tokens=max_tokens, temperature=0, n=n))])
    return [s.output_token_ids for s in sorted(out["r"], key=lambda s: s.index)]


def ids(text: str) -> list[int]:
    return [int(t) for t in text.split()]


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text) for s in fam.samples
    }


def test_n_choices_stream_interleaved_with_their_index_and_usage_counts_them_all():
    openai = pytest.importorskip("openai")
    question = [{"role": "user", "content": "Three names for a metro line?"}]
    prompt = StandInTokenizer().chat_prompt([("user", question[0]["content"])])
    with sim_server(step_time=0.002) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=30)
        chunks = list(client.chat.completions.create(
            model="sim", messages=question, max_tokens=9, temperature=0, n=3, stream=True,
            stream_options={"include_usage": True},
        ))
        whole = client.completions.create(model="sim", prompt=[5, 6, 7], max_tokens=4, n=2, temperature=0)
        all_ended = not srv.engine.has_unfinished()
        srv.engine.pool.check_invariants([])
    order = [c.choices[0].index for c in chunks if c.choices]
    texts, reasons = {}, {}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
    expected = samples(prompt, 9, 3)
    assert [ids(texts[i]) for i in range(3)] == expected
    assert len({tuple(e) for e in expected}) == 3  # three different samples
    assert reasons == {0: "length", 1: "length", 2: "length"}
    # interleaved as they are made: every index appears before any index's last chunk
    assert max(order.index(i) for i in range(3)) < min(len(order) - 1 - order[::-1].index(i) for i in range(3))
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), 3 * 9)
    assert [c.index for c in whole.choices] == [0, 1]
    assert [ids(c.text) for c in whole.choices] == samples([5, 6, 7], 4, 2)
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (3, 2 * 4)
    assert all_ended


def test_several_prompts_in_one_completion_answer_prompt_by_prompt_streamed_or_not():
    """OpenAI's batch of prompts (`prompt: [...]`, texts or token lists): choice `i * n + j` is
    sample j of prompt i, with the tokens that prompt gets alone; usage sums them all; a prompt of
    the batch over max_model_len answers 400 naming it and nothing runs; a client that hangs up
    cancels every prompt of its batch."""
    openai = pytest.importorskip("openai")
    tok = StandInTokenizer()
    texts = ["Name a line.", "x", "Which metro is oldest?"]
    with sim_server(step_time=0.001, max_model_len=64) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=30)
        whole = client.completions.create(model="sim", prompt=texts, max_tokens=5, n=2, temperature=0)
        chunks = list(client.completions.create(model="sim", prompt=[[5, 6, 7], [9]], max_tokens=4, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        too_long = httpx.post(srv.url + "/v1/completions", json={"prompt": ["ok", "y" * 70], "max_tokens": 2})
        assert all_ended(srv)
        # hang up after the first chunk of a batch of two long ones: both are cancelled
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=30,
                          json={"prompt": [[1], [2]], "max_tokens": 50, "stream": True}) as r:
            next(r.iter_lines())
        assert all_ended(srv)
        m = metrics(srv.url)
    assert [c.index for c in whole.choices] == list(range(6))
    expected = [s for text in texts for s in samples(tok.encode(text), 5, 2)]
    assert [ids(c.text) for c in whole.choices] == expected
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (sum(len(tok.encode(t)) for t in texts), 30)
    streamed: dict[int, str] = {}
    for c in chunks:
        for choice in c.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert [ids(streamed[i]) for i in range(2)] == [samples([5, 6, 7], 4, 1)[0], samples([9], 4, 1)[0]]
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 8)
    error = too_long.json()["error"]
    assert too_long.status_code == 400 and error["param"] == "prompt.1"
    assert error["message"].startswith("prompt 1: ") and "exceeds max_model_len=64" in error["message"]
    finished = {k[1]: v for k, v in m.items() if k[0] == "metroline_requests_finished_total"}
    # samples: 3 x 2 + 2 ran to their length (the "ok" of the refused batch never ran: 9 if it
    # had); the hung-up batch's 2 were cancelled
    assert finished == {(("reason", "length"), ("tenant", "default")): 3 * 2 + 2,
                        (("reason", "cancelled"), ("tenant", "default")): 2}


def all_ended(srv: ServerThread, seconds: float = 30.0) -> bool:
    """Whether the engine ended every request within `seconds` (it takes a few steps of a
    millisecond; the bound is for a loaded machine whose server thread waits for a core), its
    pool checked."""
    deadline = time.monotonic() + seconds
    while srv.engine.has_unfinished():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    srv.engine.pool.check_invariants([])
    return True


def test_more_choices_than_max_num_seqs_or_an_empty_stop_string_answer_400_naming_the_field():
    with sim_server(step_time=0.001, max_num_seqs=4) as srv:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "n": 5})
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "n": 4})
        empty_stop = httpx.post(srv.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "stop": [""]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "n")
    assert "n (5) exceeds max_num_seqs=4" in r.json()["error"]["message"]
    assert (empty_stop.status_code, empty_stop.json()["error"]["param"]) == (400, "stop")
    assert ok.status_code == 200 and [c["index"] for c in ok.json()["choices"]] == [0, 1, 2, 3]


def _open_stream(port: int, body: dict) -> socket.socket:
    """POST a streamed completion on a socket with a small receive buffer, and read nothing."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    data = json.dumps({**body, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s


def _wait(cond, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


_FRAME = re.compile(rb'data: (\{[^\n]*\})\n\n')


def test_a_client_that_stops_reading_is_paused_holding_its_blocks_and_resumes_when_it_reads():
    long = 30_000
    with sim_server(step_time=0.0001, serve={"buffer_tokens": 8}, max_model_len=long + 8,
                    num_blocks=(long + 8) // 16 + 64) as srv:
        loop = srv.server_state.loop
        sock = _open_stream(srv.port, {"prompt": [1, 2, 3], "max_tokens": long})
        try:
            # the socket buffers fill, the handler blocks writing, 8 tokens go unread: paused
            _wait(lambda: loop.backpressure.paused)
            (rid,) = loop.backpressure.paused
            seq = srv.engine.sequences(rid)[0]
            held = (len(seq.token_ids), list(seq.block_table))
            # the server goes on serving the others meanwhile
            other = httpx.post(srv.url + "/v1/completions", json={"prompt": [4, 5], "max_tokens": 40}, timeout=30)
            assert other.status_code == 200 and ids(other.json()["choices"][0]["text"]) == samples([4, 5], 40, 1)[0]
            assert (len(seq.token_ids), list(seq.block_table), seq.state.name) == (*held, "RUNNING")
            assert held[0] - 3 < long  # paused well before its end
            # the client reads again: the request resumes where it stopped
            raw, got, want = b"", [], held[0] - 3 + 500
            sock.settimeout(30)
            while len(got) < want:
                raw += sock.recv(1 << 16)
                cut = raw.rfind(b"\n\n") + 2  # whole frames only
                if cut < 2:
                    continue
                got += ids("".join(json.loads(m)["choices"][0]["text"] for m in _FRAME.findall(raw[:cut])))
                raw = raw[cut:]
            assert got == samples([1, 2, 3], len(got), 1)[0]
            assert seq.num_preemptions == 0 and seq.recomputed_tokens == 0  # nothing freed, nothing recomputed
            assert loop.pauses >= 1
        finally:
            sock.close()
        _wait(lambda: not srv.engine.has_unfinished())  # hung up: cancelled, its blocks freed
        srv.engine.pool.check_invariants([])
        assert srv.engine.pool.num_used_blocks() == 0


def test_a_client_paused_past_the_stall_timeout_is_cancelled_and_its_blocks_freed():
    long = 30_000
    with sim_server(step_time=0.0001, serve={"buffer_tokens": 8, "stall_timeout": 0.3},
                    max_model_len=long + 8, num_blocks=(long + 8) // 16 + 64) as srv:
        loop = srv.server_state.loop
        sock = _open_stream(srv.port, {"prompt": [1, 2, 3], "max_tokens": long})
        try:
            _wait(lambda: loop.pauses >= 1)
            # the client keeps its connection but never reads: cancelled after the stall timeout
            _wait(lambda: not srv.engine.has_unfinished() and not loop.streams)
            srv.engine.pool.check_invariants([])
            assert srv.engine.pool.num_used_blocks() == 0
            m = metrics(srv.url)
        finally:
            sock.close()
    assert m[("metroline_requests_finished_total", (("reason", "cancelled"), ("tenant", "default")))] == 1
    assert m[("metroline_stream_pauses_total", ())] == loop.pauses == 1
    assert m[("metroline_paused_requests", ())] == 0 and not loop.backpressure.paused


def test_the_pre_encoded_text_frames_equal_the_general_encoding():
    from metroline.core.serving import protocol as p

    for chat in (True, False):
        shapes = p.Shapes("abc123", "m\u00e9tro \"sim\"", chat)
        for index, text, first in ((0, " 17", True), (2, 'quote " back\\slash \u00e9\n', False), (1, "", False)):
            assert shapes.delta(index, text, first).encode() == p.sse(shapes.chunk(text, first=first, index=index))


def test_usage_is_streamed_once_only_when_asked_with_cached_tokens_and_a_fingerprint():
    """As OpenAI's and vLLM's: without `stream_options.include_usage` no chunk has `usage`; with it,
    one last chunk with no choices does, before [DONE]. `cached_tokens` counts the prompt tokens
    the prefix cache served (block size 16: a repeated 40-token prompt finds 2 full blocks); a
    request without `max_tokens` may generate the rest of the context."""
    prompt = list(range(1, 41))
    with sim_server(step_time=0.001, max_model_len=64) as srv:
        def stream(options: dict | None) -> list[dict]:
            body = {"prompt": prompt, "max_tokens": 3, "stream": True, **({"stream_options": options} if options else {})}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
                lines = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
            assert lines[-1] == "[DONE]"
            return [json.loads(x) for x in lines[:-1]]

        plain = stream(None)
        asked = stream({"include_usage": True})
        whole = httpx.post(srv.url + "/v1/completions", json={"prompt": prompt, "ignore_eos": True}).json()
    assert not any("usage" in c for c in plain)
    assert [("usage" in c) for c in asked] == [False] * (len(asked) - 1) + [True]
    last = asked[-1]
    assert last["choices"] == [] and last["usage"]["prompt_tokens"] == 40 and last["usage"]["completion_tokens"] == 3
    assert last["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    fingerprints = {c["system_fingerprint"] for c in plain + asked} | {whole["system_fingerprint"]}
    assert len(fingerprints) == 1 and fingerprints.pop().startswith("fp_")
    assert whole["usage"]["completion_tokens"] == 64 - 40  # the rest of the context
