"""Request files with text prompts and sampling fields (JSONL), and the `--outputs` file."""

from __future__ import annotations

import json

import pytest

from metroline import cli
from metroline.core.requests.request import SamplingParams
from metroline.core.workloads.build import WorkloadError, build_workload
from metroline.core.workloads.text_requests import is_request_file, load_requests


def write(tmp_path, *lines, name="reqs.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def error_of(path, tokenizer=None):
    with pytest.raises(WorkloadError) as e:
        load_requests(path, tokenizer)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_line_gives_its_request_and_sampling(tmp_path):
    path = write(
        tmp_path,
        {"id": "q1", "prompt_token_ids": [4, 5, 6], "max_new_tokens": 7, "arrival_s": 1.5, "tenant": "beta",
         "priority": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "min_p": 0.1, "repetition_penalty": 1.1,
         "frequency_penalty": -0.5, "presence_penalty": 0.5, "seed": 11, "stop_token_ids": [9],
         "ignore_eos": True, "min_tokens": 2, "n": 3},
        "",
        {"prompt_token_ids": [1]},
    )
    first, second = load_requests(path)
    assert first.request_id == "q1" and first.prompt_token_ids == (4, 5, 6)
    assert (first.arrival_s, first.tenant, first.priority) == (1.5, "beta", 2)
    assert first.sampling == SamplingParams(
        max_new_tokens=7, temperature=0.5, top_p=0.9, top_k=3, min_p=0.1, repetition_penalty=1.1,
        frequency_penalty=-0.5, presence_penalty=0.5, seed=11, stop_token_ids=(9,), ignore_eos=True,
        min_tokens=2, n=3,
    )
    assert second.request_id == "3" and second.sampling == SamplingParams()  # id: its line number
    data = first.request_data("ignored", oracle=True)
    assert data["request_id"] == "q1" and data["expected_output_tokens"] is None  # a stop id may end it
    (fixed,) = load_requests(write(tmp_path, {"prompt_token_ids": [1], "max_new_tokens": 9, "ignore_eos": True}))
    assert fixed.request_data("0", oracle=True)["expected_output_tokens"] == 9  # nothing ends it early
    assert fixed.request_data("0")["expected_output_tokens"] is None


def test_bad_lines_name_the_file_the_line_and_the_field(tmp_path):
    ok = {"prompt_token_ids": [1]}
    cases = [
        ("{not json", "invalid JSON"),
        ({"prompt_token_ids": [1], "top_p": 1.5}, "top_p: Input should be less than or equal to 1"),
        ({"prompt_token_ids": [1], "min_p": -0.1}, "min_p: Input should be greater than or equal to 0"),
        ({"prompt_token_ids": [1], "presence_penalty": 2.5}, "presence_penalty: Input should be less than or equal to 2"),
        ({"prompt_token_ids": [1], "repetition_penalty": 0}, "repetition_penalty: Input should be greater than 0"),
        ({"prompt_token_ids": [1], "max_new_tokens": 2, "min_tokens": 3}, "min_tokens (3) must be <= max_new_tokens (2)"),
        ({"prompt_token_ids": [1], "tmperature": 0.5}, "tmperature: Extra inputs are not permitted"),
        ({"prompt_token_ids": [-1]}, "prompt_token_ids.0: Input should be greater than or equal to 0"),
        ({"prompt_token_ids": [1], "arrival_s": -1}, "arrival_s: Input should be greater than or equal to 0"),
        ({"prompt": "hi", "prompt_token_ids": [1]}, "give exactly one of prompt (text) and prompt_token_ids"),
        ({"max_new_tokens": 3, "prompt_token_ids": None}, "give exactly one of prompt"),
        ({"prompt": "hi"}, "prompt: a text prompt needs a tokenizer"),
        ({"prompt_token_ids": [1], "stop": "x"}, "stop: stop strings need a tokenizer"),
        ("[1, 2]", "expected a JSON object, got list"),
        ({"prompt_token_ids": [1], "metadata": {"k" * 65: "v"}}, "String should have at most 64 characters"),
        ({"prompt_token_ids": [1], "metadata": {"k": "v" * 513}}, "metadata.k.constrained-str: String should have at most 512"),
        ({"prompt_token_ids": [1], "metadata": {str(i): 1 for i in range(17)}}, "metadata: Dictionary should have at most 16 items"),
    ]
    for bad, expected in cases:
        path = write(tmp_path, ok, bad)
        message = error_of(path)
        assert message.startswith(f"{path}:2: ") and expected in message, (bad, message)
    path = write(tmp_path, {"id": 7, "prompt_token_ids": [1]}, ok, {"id": "7", "prompt_token_ids": [2]})
    assert error_of(path) == f"{path}:3: id: '7' is already the id of line 1"
    assert error_of(write(tmp_path, "", "")).endswith("the request file has no requests")


def test_a_request_file_is_told_apart_from_a_mooncake_trace(tmp_path):
    trace = write(tmp_path, {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}, name="t.jsonl")
    reqs = write(tmp_path, "", {"prompt": "x"}, name="r.jsonl")
    assert not is_request_file(trace) and is_request_file(reqs)
    assert build_workload(str(trace)).items[0].prompt_len == 10  # still read as a trace


def test_build_workload_sorts_cuts_and_scales_a_request_file(tmp_path):
    path = write(
        tmp_path,
        {"id": "late", "prompt_token_ids": [1, 2], "arrival_s": 2.0},
        {"id": "early", "prompt_token_ids": [3], "arrival_s": 1.0, "max_new_tokens": 5},
        {"id": "last", "prompt_token_ids": [4], "arrival_s": 3.0},
    )
    workload = build_workload(str(path), rate_scale=2.0, max_requests=2)
    assert [(it.request_id, it.arrival_s) for it in workload.items] == [("early", 0.5), ("late", 1.0)]
    assert workload.describe()["mean_prompt_tokens"] == 1.5
    assert workload.describe()["mean_output_tokens"] == (5 + 16) / 2
    with pytest.raises(WorkloadError, match="length_scale does not apply"):
        build_workload(str(path), length_scale=2.0)


def test_cli_run_writes_the_outputs_file_in_simulation(tmp_path, capsys):
    path = write(
        tmp_path,
        {"id": "a", "prompt_token_ids": [1, 2, 3], "max_new_tokens": 4, "n": 2, "seed": 5},
        {"id": "b", "prompt_token_ids": [7], "max_new_tokens": 2, "arrival_s": 0.5},
    )
    out = tmp_path / "out.jsonl"
    assert cli.main(["run", "--workload", str(path), "--outputs", str(out)]) == 0
    records = sorted((json.loads(line) for line in out.read_text().splitlines()),
                     key=lambda r: (r["id"], r.get("index", 0)))
    assert [(r["id"], r.get("index")) for r in records] == [("a", 0), ("a", 1), ("b", None)]
    assert [r["prompt_token_ids"] for r in records] == [[1, 2, 3], [1, 2, 3], [7]]
    assert [len(r["output_token_ids"]) for r in records] == [4, 4, 2]
    assert all(r["text"] is None and r["finish_reason"] == "length" for r in records)
    assert set(records[0]) == {"id", "index", "prompt_token_ids", "output_token_ids", "text", "finish_reason"}


def test_cli_run_refuses_a_text_prompt_without_a_tokenizer(tmp_path, capsys):
    path = write(tmp_path, {"prompt_token_ids": [1]}, {"id": "x", "prompt": "hello"})
    assert cli.main(["run", "--workload", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"metroline: error: {path}:2: prompt: a text prompt needs a tokenizer and this executor has none "
        "(give prompt_token_ids, or run a real model)"
    )


# --- with a real tokenizer -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from sampling_models import bpe_tokenizer

    return bpe_tokenizer()


def test_text_prompts_are_encoded_and_chat_prompts_templated(tmp_path, tokenizer):
    from transformers import PreTrainedTokenizerFast

    path = write(tmp_path, {"id": "plain", "prompt": "the cat"}, {"id": "chat", "prompt": "the cat", "chat": True})
    plain, chat = load_requests(path, tokenizer)
    assert list(plain.prompt_token_ids) == tokenizer.encode("the cat")
    assert list(chat.prompt_token_ids) == tokenizer.encode("<user>the cat<assistant>")  # the template's text
    no_template = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    assert load_requests(path, no_template)[1].prompt_token_ids == plain.prompt_token_ids
    assert error_of(write(tmp_path, {"prompt": ""}), tokenizer).endswith("prompt: the text encodes to no tokens")


def test_a_text_request_file_runs_on_a_model_and_the_outputs_have_the_text(tmp_path, tokenizer):
    from sampling_models import ScriptedModel

    from metroline.core.config import EngineConfig
    from metroline.core.experiments.runner import run_workload
    from metroline.core.workloads.text_requests import OutputsWriter

    script = tokenizer.encode("the cat sat on the mat.")
    path = write(
        tmp_path,
        {"id": "stop", "prompt": "a dog", "temperature": 0, "stop": ["t on"], "max_new_tokens": 20},
        {"id": "eos", "prompt": "a cat", "chat": True, "temperature": 0, "max_new_tokens": 20},
        {"id": "len", "prompt_token_ids": [5], "temperature": 0, "max_new_tokens": 2, "arrival_s": 0.02},
    )
    workload = build_workload(str(path), tokenizer=tokenizer)
    writer = OutputsWriter(tmp_path / "out.jsonl")
    run_workload(workload, EngineConfig(), ScriptedModel(script, tokenizer, tokenizer.eos_token_id), plugins=[writer])
    writer.close()
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert records["stop"] == {
        "id": "stop", "prompt_token_ids": tokenizer.encode("a dog"), "output_token_ids": script[:4],
        "text": "the cat sa", "finish_reason": "stop",
    }
    assert records["eos"]["prompt_token_ids"] == tokenizer.encode("<user>a cat<assistant>")
    assert records["eos"]["output_token_ids"] == [*script, tokenizer.eos_token_id]
    assert (records["eos"]["text"], records["eos"]["finish_reason"]) == ("the cat sat on the mat.", "eos")
    assert (records["len"]["text"], records["len"]["finish_reason"]) == ("the cat", "length")


def test_a_lines_metadata_reaches_the_plugins_on_each_sample(tmp_path):
    from metroline import hookimpl
    from metroline.core.config import EngineConfig
    from metroline.core.step.engine import Engine

    class Seen:
        def __init__(self):
            self.metadata = {}

        @hookimpl
        def on_finished(self, seqs):
            self.metadata.update({s.seq_id: dict(s.metadata) for s in seqs})

    sent = {"slo_class": "batch", "weight": 0.5, "vip": False}
    items = load_requests(write(tmp_path, {"id": "a", "prompt_token_ids": [1, 2], "max_new_tokens": 2, "n": 2,
                                           "metadata": sent}, {"id": "b", "prompt_token_ids": [3]}))
    seen = Seen()
    engine = Engine(EngineConfig(), plugins=[seen])
    engine.generate([it.request_data(it.request_id) for it in items])
    assert seen.metadata == {"a": sent, "a#1": sent, "b": {}}


def test_the_outputs_line_carries_the_logprobs_a_request_asked_for():
    from metroline.core.requests.request import Request
    from metroline.core.requests.sequence import Sequence
    from metroline.core.workloads.text_requests import output_record

    asked = Sequence.from_request(Request(request_id="a", prompt_token_ids=[1], sampling=SamplingParams(logprobs=1)),
                                  0.0, 0)
    asked.token_ids.append(7)
    asked.logprobs.append((-0.5, ((7, -0.5),)))
    assert output_record(asked)["logprobs"] == [[-0.5, [[7, -0.5]]]]
    plain = Sequence.from_request(Request(request_id="b", prompt_token_ids=[1]), 0.0, 0)
    assert plain.logprobs is None and "logprobs" not in output_record(plain)
