"""Sampling through the engine on real logits tensors: seeds independent of the batch, n > 1,
stop token ids, min_tokens, and stop strings detokenised incrementally with a real tokenizer."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sampling_models import LinearModel, ScriptedModel, bpe_tokenizer  # noqa: E402

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.requests.sequence import FinishReason  # noqa: E402
from metroline.core.step.engine import Engine  # noqa: E402

VOCAB = 64
TARGET = dict(temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.2, seed=1234, max_new_tokens=24)


def req(rid, prompt, **sampling):
    sampling.setdefault("max_new_tokens", 12)
    return {"request_id": rid, "prompt_token_ids": prompt, "arrival_time": 0.0, "sampling": sampling}


def others(n):
    """`n` requests of every kind: greedy, unseeded, seeded, penalised; prompts of 3 to 40 tokens."""
    out = []
    for i in range(n):
        kind = i % 4
        sampling = [dict(temperature=0.0), dict(temperature=1.0), dict(seed=i, top_k=5),
                    dict(min_p=0.1, presence_penalty=1.0)][kind]
        out.append(req(f"o{i}", [(i * 7 + j) % VOCAB for j in range(3 + (i * 5) % 38)], **sampling))
    return out


def outputs(config, requests):
    engine = Engine(EngineConfig(**config), LinearModel(VOCAB))
    done = engine.generate(requests)
    preemptions = sum(s.num_preemptions for seqs in done.values() for s in seqs)
    return {rid: [s.output_token_ids for s in seqs] for rid, seqs in done.items()}, preemptions


def test_a_seeded_request_gets_the_same_tokens_alone_and_in_a_batch_of_32():
    target = req("t", [3, 1, 4, 1, 5, 9, 2, 6], **TARGET)
    alone, _ = outputs({}, [target])
    tokens = alone["t"][0]
    assert len(tokens) == 24 and len(set(tokens)) > 4  # a real draw, not a constant
    batch = others(16) + [target] + others(31)[16:]
    together, _ = outputs({}, batch)
    assert together["t"][0] == tokens
    # the same with chunked prefill and a pool so small that requests are preempted (recompute)
    squeezed, preemptions = outputs(dict(num_blocks=20, block_size=4, max_prefill_chunk=7), batch)
    assert squeezed["t"][0] == tokens
    assert preemptions > 0


def test_n_children_sample_independently_and_reproducibly():
    prompt = [5, 6, 7]
    first, _ = outputs({}, [req("r", prompt, n=4, seed=9, temperature=1.0)])
    again, _ = outputs({}, others(8) + [req("r", prompt, n=4, seed=9, temperature=1.0)])
    assert first["r"] == again["r"]
    assert len({tuple(t) for t in first["r"]}) == 4  # each child its own stream
    greedy, _ = outputs({}, [req("g", prompt, n=4, temperature=0.0)])
    single, _ = outputs({}, [req("g", prompt, temperature=0.0)])
    assert greedy["g"] == single["g"] * 4


def test_stop_token_ids_and_min_tokens():
    model = LinearModel(VOCAB)
    greedy, _ = outputs({}, [req("g", [1, 2], temperature=0.0, max_new_tokens=10)])
    tokens = greedy["g"][0]
    stop = tokens[3]
    first = tokens.index(stop)
    engine = Engine(EngineConfig(), model)
    done = engine.generate([req("s", [1, 2], temperature=0.0, max_new_tokens=10, stop_token_ids=[stop])])
    seq = done["s"][0]
    assert seq.output_token_ids == tokens[: first + 1] and seq.finish_reason is FinishReason.STOP
    # min_tokens beyond the first stop: the stop id is not sampled before, and greedy takes the
    # next best token there instead
    engine = Engine(EngineConfig(), LinearModel(VOCAB))
    done = engine.generate([req("m", [1, 2], temperature=0.0, max_new_tokens=10, stop_token_ids=[stop],
                                min_tokens=first + 1)])
    out = done["m"][0].output_token_ids
    assert stop not in out[: first + 1] and out[:first] == tokens[:first]


# --- stop strings, detokenised incrementally -------------------------------------------------

TEXT = "the cat sat on the mat. café 🚇"


def run_text(stop=(), min_tokens=0, text=TEXT):
    tok = bpe_tokenizer()
    script = tok.encode(text)
    engine = Engine(EngineConfig(), ScriptedModel(script, tok, tok.eos_token_id))
    engine.add_request(req("x", tok.encode("a dog"), temperature=0.0, max_new_tokens=40, stop=list(stop),
                           min_tokens=min_tokens))
    streamed = [out.text for out in engine.stream()]
    return engine.sequences("x")[0], streamed, script


def first_tokens_containing(script, s):
    """The fewest leading script tokens whose full decode contains `s` (the reference)."""
    tok = bpe_tokenizer()
    return next(k for k in range(1, len(script) + 1) if s in tok.decode(script[:k]))


def test_the_tokenizer_splits_the_text_as_the_tests_assume():
    tok = bpe_tokenizer()
    script = tok.encode(TEXT)
    pieces = [tok.decode([t]) for t in script]
    assert pieces[:4] == ["the", " cat", " sat", " on"]
    assert not any("t on" in p for p in pieces)  # "t on" spans the boundary ' sat' | ' on'
    assert "\ufffd" in "".join(pieces)  # some characters are split across byte tokens


def test_without_stop_strings_the_text_is_the_full_decode_and_eos_ends_it():
    seq, streamed, script = run_text()
    assert seq.finish_reason is FinishReason.EOS
    assert seq.output_token_ids == [*script, bpe_tokenizer().eos_token_id]
    assert seq.text == TEXT
    assert all("\ufffd" not in t for t in streamed)  # a split character waits for its last byte
    assert all(TEXT.startswith(t) for t in streamed)


def test_a_stop_string_across_a_token_boundary_cuts_the_text_before_it():
    seq, streamed, script = run_text(stop=["t on"])
    k = first_tokens_containing(script, "t on")
    assert k == 4
    assert seq.finish_reason is FinishReason.STOP
    assert seq.output_token_ids == script[:k]  # the tokens are kept, the text is cut
    assert seq.text == "the cat sa" and streamed[-1] == "the cat sa"


def test_a_stop_string_inside_a_token_and_the_earliest_of_several():
    seq, _, script = run_text(stop=["mat", "at"])
    assert seq.text == "the c" and seq.output_token_ids == script[:2]
    seq, _, script = run_text(stop=["é"])  # a character made of two byte tokens
    assert seq.text == "the cat sat on the mat. caf"
    assert seq.output_token_ids == script[: first_tokens_containing(script, "é")]


def test_min_tokens_defers_the_stop_string_check():
    seq, _, script = run_text(stop=["the"], min_tokens=3)
    assert seq.text == "the cat sat on "  # the first "the" came before min_tokens
    assert seq.output_token_ids == script[:5]


def test_stop_strings_need_a_tokenizer():
    engine = Engine(EngineConfig(), LinearModel(VOCAB))
    with pytest.raises(ValueError, match="sampling.stop: stop strings need a tokenizer"):
        engine.add_request(req("x", [1], stop=["a"]))


def test_a_sample_plugin_sees_the_logits_tensor_and_the_eos_id():
    from metroline.core.plugins.hookspecs import hookimpl

    seen = []

    class Lowest:
        name = "lowest"

        @hookimpl
        def sample(self, seqs, logits, eos_token_id):
            seen.append((type(logits), tuple(logits.shape), eos_token_id))
            return logits.argmin(dim=-1).tolist()

    model = LinearModel(VOCAB, eos_token_id=63)
    engine = Engine(EngineConfig(), model, plugins=[Lowest()])
    done = engine.generate([req("a", [1, 2], max_new_tokens=3), req("b", [3], max_new_tokens=3, n=2)])
    assert seen[0] == (torch.Tensor, (3, VOCAB), 63)  # a, b and b's new child (a copy of b's row)
    out = done["a"][0].output_token_ids
    expected, history = [], [1, 2]
    for _ in range(3):  # the argmin of the model's logits, step by step
        history.append(int(model.logits([type("S", (), {"token_ids": history})()]).argmin()))
        expected.append(history[-1])
    assert out == expected
