"""Any body the server is sent gets an answer in OpenAI's format and never a 500 (a 404 only for a
model it does not serve): valid bodies with a few fields changed to wrong values (NaN, huge
numbers, nested junk), any set of fields, bytes that are not JSON at all; both endpoints, streamed
or not, with a key or without. The server then still serves a plain request, and the engine ends
with every block free."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from test_serve import all_free_or_evictable, sim_server  # noqa: E402

CAMPAIGN = os.environ.get("SERVE_FUZZ")
"""`SERVE_FUZZ=N`: N random examples (a new draw each run) instead of the suite's fixed 300."""
EXAMPLES = int(CAMPAIGN or 300)
KEY = {"Authorization": "Bearer key-a"}
TENANTS = {"tenants": {"alpha": {"api_keys": ["key-a"]}}}

JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
"""Any JSON value (Python's json writes NaN and Infinity, and the server's parser reads them)."""

SMALL_INT = st.integers(-3, 40)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "robot"]) | JUNK},
    optional={"content": st.text(max_size=20) | st.lists(st.fixed_dictionaries({"text": st.text(max_size=8)}),
                                                         max_size=2) | JUNK},
)
FIELDS = {
    "model": st.text(max_size=8) | JUNK,
    "messages": st.lists(MESSAGE, max_size=3) | JUNK,
    "prompt": st.text(max_size=30) | st.lists(st.integers(-5, 70000), max_size=8) | JUNK,
    "max_tokens": SMALL_INT | JUNK,
    "max_completion_tokens": SMALL_INT | JUNK,
    "temperature": st.floats(-1, 3) | JUNK,
    "top_p": st.floats(-0.5, 1.5) | JUNK,
    "top_k": SMALL_INT | JUNK,
    "n": st.integers(-1, 6) | JUNK,
    "seed": st.integers(-(2**65), 2**65) | JUNK,
    "stream": st.booleans() | JUNK,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | JUNK}) | JUNK,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3) | JUNK,
    "stop_token_ids": st.lists(st.integers(-5, 70000), max_size=3) | JUNK,
    "ignore_eos": st.booleans() | JUNK,
    "priority": SMALL_INT | JUNK,
    "deadline_s": st.floats(-1, 100) | JUNK,
    "expected_output_tokens": SMALL_INT | JUNK,
}
BASE = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        "/v1/completions": {"prompt": "hi", "max_tokens": 3}}
"""A valid body of each endpoint, which the fuzz changes a few fields of."""
CHANGES = st.lists(st.sampled_from(sorted(FIELDS)), max_size=3, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({k: FIELDS[k] for k in keys}))

RAW = st.binary(max_size=40) | JUNK.map(lambda v: json.dumps(v).encode())
"""Bodies that are not an object of fields at all."""


def test_any_body_answers_in_openai_format_without_a_500_and_the_server_serves_on():
    seen: dict[int, int] = {}
    with sim_server(step_time=0.0005, serve=TENANTS, max_model_len=96, max_num_seqs=8) as srv:
        client = httpx.Client(base_url=srv.url, timeout=30)

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=CAMPAIGN is None, suppress_health_check=list(HealthCheck))
        @given(st.sampled_from(sorted(BASE)), st.one_of(
            CHANGES.map(lambda c: ("changed", c)),  # a valid body with up to 3 fields changed
            st.fixed_dictionaries({}, optional=FIELDS).map(lambda d: ("fields", d)),  # any fields
            RAW.map(lambda b: ("raw", b))),
            st.sampled_from([True, True, True, False]))
        def one(path: str, drawn: tuple, keyed: bool) -> None:
            kind, value = drawn
            body = value if kind == "raw" else json.dumps({**BASE[path], **value} if kind == "changed" else value).encode()
            headers = {**(KEY if keyed else {}), "Content-Type": "application/json"}
            with client.stream("POST", path, content=body, headers=headers) as r:
                raw = r.read()
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            assert r.status_code in (200, 400, 401, 404, 429), (body, r.status_code, raw[:300])
            if r.status_code != 200:
                error = json.loads(raw)["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["message"], error
                return
            if r.headers["content-type"].startswith("text/event-stream"):
                events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
                assert events[-1] == "[DONE]", events[-3:]
                assert "error" not in json.loads(events[-2]), events[-2]  # the request ran to its end
            else:
                doc = json.loads(raw)
                assert doc["choices"] and doc["usage"]["completion_tokens"] >= len(doc["choices"])

        one()
        ok = client.post("/v1/chat/completions", headers=KEY,
                         json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
        client.close()
        engine = srv.engine
    all_free_or_evictable(engine)
    # the fuzz reached the engine and its refusals alike, not only the parser's
    assert seen.get(200, 0) >= 10 and seen.get(400, 0) >= 10 and seen.get(401, 0) >= 10, seen
