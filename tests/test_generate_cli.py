"""`metroline generate`: text streamed as it is generated, equal to HF generate's greedy text, on a
seeded random tiny Llama saved with a tokenizer trained offline."""

from __future__ import annotations

import copy as copy_module
import io

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from metroline.cli import main

CORPUS = [
    "the metro line runs under the river and stops at every station",
    "passengers board and leave the train at each stop of the line",
    "a scheduler decides who boards when the cars are full",
    "tokens stream out of the model one at a time, like trains",
] * 4


def _tokenizer() -> PreTrainedTokenizerFast:
    # SentencePiece-style pieces (a leading "▁" for a space) so that a token's text depends on its
    # neighbours: decoding token by token would drop or double spaces
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=96, special_tokens=["<unk>", "</s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-with-tokenizer")
    tokenizer = _tokenizer()
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


def _hf_greedy_text(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    ids = torch.tensor([tokenizer.encode(prompt)])
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    prompt_ids, new = ids[0].tolist(), out[0, ids.shape[1]:].tolist()
    assert len(new) == max_new_tokens
    # the text the output adds to the prompt's (what vLLM streams): decoding the
    # new ids alone would drop a leading "▁" space that the prompt's context keeps
    whole = tokenizer.decode(prompt_ids + new, skip_special_tokens=True)
    before = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    assert whole.startswith(before)
    return whole[len(before):]


class Recorder(io.StringIO):
    """stdout that remembers each write, to see the text arrive in pieces."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


def test_streamed_text_equals_hf_greedy_text(model_dir, monkeypatch):
    folder, model, tokenizer = model_dir
    prompt = "the metro line runs"
    expected = _hf_greedy_text(model, tokenizer, prompt, 24)
    assert expected.strip()  # something to compare
    out = Recorder()
    monkeypatch.setattr("sys.stdout", out)
    assert main(["generate", "--model", str(folder), "--max-new-tokens", "24", prompt]) == 0
    assert out.getvalue() == expected + "\n"
    pieces = [w for w in out.writes if w]
    assert len(pieces) > 10  # streamed token by token, not printed at the end


def test_several_prompts_print_in_order_under_headers(model_dir, monkeypatch):
    folder, model, tokenizer = model_dir
    prompts = ["passengers board", "a scheduler decides who", "tokens"]
    expected = [_hf_greedy_text(model, tokenizer, p, 12) for p in prompts]
    out = Recorder()
    monkeypatch.setattr("sys.stdout", out)
    assert main(["generate", "--model", str(folder), "--max-new-tokens", "12", *prompts]) == 0
    assert out.getvalue() == "".join(
        f"{'' if i == 0 else chr(10)}[{i + 1}] {p}\n{t}" for i, (p, t) in enumerate(zip(prompts, expected))
    ) + "\n"


def test_seeded_sampling_is_reproducible_and_differs_from_greedy(model_dir, capsys):
    folder, _, _ = model_dir
    argv = ["generate", "--model", str(folder), "--max-new-tokens", "16", "--temperature", "1.5"]
    texts = []
    for seed in (1, 1, 2):
        assert main([*argv, "--seed", str(seed), "passengers board"]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-new-tokens", "0", "x"], "--max-new-tokens: Input should be greater than or equal to 1"),
        (["--top-p", "1.5", "x"], "--top-p: Input should be less than or equal to 1"),
        (["--chat", "x"], "--chat: the model's tokenizer has no chat template"),
    ],
)
def test_bad_flags_one_line_errors(model_dir, argv, message, capsys):
    folder, _, _ = model_dir
    assert main(["generate", "--model", str(folder), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.splitlines()[-1].startswith("metroline: error:")


def test_a_prompt_over_max_model_len_is_refused(model_dir, capsys):
    folder, _, _ = model_dir
    long_prompt = " ".join(["the metro line runs"] * 80)  # far over 256 tokens
    assert main(["generate", "--model", str(folder), long_prompt]) == 2
    assert "exceeds max_model_len=256" in capsys.readouterr().err


# --- the chat template: by default when the model has one, --raw without it -------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}a scheduler decides {{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %} the line{% endif %}"
)


@pytest.fixture(scope="module")
def chat_model_dir(model_dir, tmp_path_factory):
    """The tiny model with a chat template on its tokenizer."""
    folder, model, tokenizer = model_dir
    chat = tmp_path_factory.mktemp("tiny-chat")
    model.save_pretrained(chat)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(chat)
    return chat, model, tokenizer


def _hf_greedy_ids_text(model, tokenizer, prompt_ids: list[int], max_new_tokens: int) -> str:
    ids = torch.tensor([prompt_ids])
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    whole = tokenizer.decode(prompt_ids + out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    before = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    return whole[len(before):]


def test_the_chat_template_is_applied_by_default_and_raw_turns_it_off(chat_model_dir, capsys):
    folder, model, tokenizer = chat_model_dir
    prompt = "who boards"
    templated = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                              tokenize=True)
    templated = list(templated if isinstance(templated, list) else templated["input_ids"])
    assert templated != tokenizer.encode(prompt)
    as_chat = _hf_greedy_ids_text(model, tokenizer, templated, 12)
    as_raw = _hf_greedy_ids_text(model, tokenizer, tokenizer.encode(prompt), 12)
    assert as_chat != as_raw and as_chat.strip() and as_raw.strip()
    argv = ["generate", "--model", str(folder), "--max-new-tokens", "12"]
    outputs = {}
    for flags in ([], ["--chat"], ["--raw"]):
        assert main([*argv, *flags, prompt]) == 0
        outputs[" ".join(flags)] = capsys.readouterr()
    assert outputs[""].out == outputs["--chat"].out == as_chat + "\n"
    assert outputs["--raw"].out == as_raw + "\n"
    assert not [o.err for o in outputs.values() if "metroline:" in o.err]  # no note: each generated text
    with pytest.raises(SystemExit) as exited:  # a usage error, as argparse's others
        main([*argv, "--chat", "--raw", prompt])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "metroline: error: --raw: not allowed with argument --chat (see metroline generate --help)\n")


@pytest.fixture(scope="module")
def eos_first_model_dir(model_dir, tmp_path_factory):
    """The tiny model changed to answer "tokens" with its end-of-sequence token ("</s>", special)
    at once: the LM head row of "</s>" is twice the row of the token it generated first."""
    folder, model, tokenizer = model_dir
    eos_id = tokenizer.convert_tokens_to_ids("</s>")
    copy = copy_module.deepcopy(model)
    copy.set_attn_implementation("eager")
    ids = torch.tensor([tokenizer.encode("tokens")])

    def first_token() -> int:
        with torch.no_grad():
            return copy.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False,
                                 pad_token_id=0)[0, -1].item()

    first = first_token()
    with torch.no_grad():
        copy.lm_head.weight[eos_id] = 2 * copy.lm_head.weight[first]
    copy.config.eos_token_id = copy.generation_config.eos_token_id = eos_id
    assert first_token() == eos_id
    eos = tmp_path_factory.mktemp("tiny-eos")
    copy.save_pretrained(eos)
    tokenizer.save_pretrained(eos)
    return eos


def test_an_empty_generation_says_why(eos_first_model_dir, capsys):
    argv = ["generate", "--model", str(eos_first_model_dir), "--max-new-tokens", "8"]
    assert main([*argv, "tokens"]) == 0
    out = capsys.readouterr()
    assert out.out == "\n"
    assert [x for x in out.err.splitlines() if "metroline" in x] == [
        "metroline: the prompt generated no text: finished by EOS after 0 tokens"]
    # with several prompts, each empty one is named; one with text is not
    assert main([*argv, "passengers board", "tokens"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("[1] passengers board\n") and out.out.endswith("\n[2] tokens\n\n")
    assert [x for x in out.err.splitlines() if "metroline" in x] == [
        "metroline: prompt 2 generated no text: finished by EOS after 0 tokens"]


@pytest.mark.slow  # SmolLM2's weights: two loads of about 20 s
def test_smollm2_answers_a_bare_question_as_a_chat_and_raw_says_why_it_is_empty(capsys):
    question = "What is the capital of France?"
    assert main(["generate", "--model", "smollm2", question]) == 0
    out = capsys.readouterr()
    if torch.cuda.is_available():  # bfloat16 on CUDA: the wording may differ
        assert "Paris" in out.out
    else:
        assert out.out == "The capital of France is Paris.\n"
    assert "generated no text" not in out.err
    assert main(["generate", "--model", "smollm2", "--raw", question]) == 0
    out = capsys.readouterr()
    assert out.out == "\n"  # the bare prompt is answered with end-of-sequence at once
    assert out.err.splitlines()[-1] == (
        "metroline: the prompt generated no text: finished by EOS after 0 tokens; --raw was given: without it the "
        "prompt is the user turn of the model's chat template"
    )


def test_deterministic_generate_is_hf_greedy(model_dir, monkeypatch):
    """`generate --deterministic`: the mode's tiled forward gives HF's greedy text for each prompt."""
    folder, model, tokenizer = model_dir
    prompts = ["passengers board", "a scheduler decides who"]
    expected = [_hf_greedy_text(model, tokenizer, p, 8) for p in prompts]
    out = Recorder()
    monkeypatch.setattr("sys.stdout", out)
    assert main(["generate", "--model", str(folder), "--max-new-tokens", "8", "--deterministic", *prompts]) == 0
    assert out.getvalue() == "".join(
        f"{'' if i == 0 else chr(10)}[{i + 1}] {p}\n{t}" for i, (p, t) in enumerate(zip(prompts, expected))
    ) + "\n"


def test_deterministic_with_speculation_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """The incompatible pair is refused in one line without loading anything: the model path does
    not exist, and the loader is never reached."""
    from metroline.core.commands import generate

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(generate, "make_executor", no_load)
    spec = '{"method": "ngram", "num_speculative_tokens": 4}'
    assert main(["generate", "--model", str(tmp_path / "absent"), "--deterministic", "--speculative-config", spec,
                 "x"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["metroline: error: --deterministic: deterministic: speculative decoding is not supported in "
                     "the deterministic mode (its tiled forward verifies no drafts); drop speculative_config or "
                     "deterministic"]
