"""`metroline generate`: text from prompts with a real model, streamed as it is generated.

A prompt is the user turn of the tokenizer's chat template when the model has one (a chat model
answers a bare prompt with end-of-sequence at once), unless `--raw`; `--chat` insists on the
template (an error without one). A prompt that generated no text says why on stderr (finished by
EOS after 0 tokens)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from ..requests.sequence import FinishReason
from ..speculative_config import speculative_json
from ..diagnostics import validation_message
from .options import fit_config, flag_name, make_executor


def use_chat_template(tokenizer: Any, chat: bool, raw: bool) -> bool:
    """Whether prompts are the user turn of the tokenizer's chat template: by default when it has
    one; `raw` never; `chat` always (a `ValueError` when it has none)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat and not has_template:
        raise ValueError("--chat: the model's tokenizer has no chat template")
    return has_template and not raw


def _encode(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """The token ids of `prompt` (the user turn of the chat template with `chat`)."""
    if chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        return list(ids if isinstance(ids, list) else ids["input_ids"])
    return list(tokenizer.encode(prompt))


class _TextStream:
    """The printable text of each sequence as its tokens arrive: the engine's incremental text
    (`out.text`) when it keeps one, else the whole output decoded again. Text that may still become
    a stop string, or ends in half a character, waits for the next token."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.hold = max(map(len, stop), default=1) - 1
        self.printed: dict[str, int] = {}

    def new_text(self, out: Any) -> str:
        text = getattr(out, "text", None)
        if text is None:
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        if not out.finished:
            text = text.rstrip("\ufffd")
            text = text[: max(0, len(text) - self.hold)]
        done = self.printed.get(out.request_id, 0)
        if len(text) <= done:
            return ""
        self.printed[out.request_id] = len(text)
        return text[done:]


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate from `args.prompts` as one batch, printing the text as it comes."""
    from ..config import EngineConfig
    from ..requests.request import SamplingParams
    from ..step.engine import Engine

    sampling: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                                "ignore_eos": args.ignore_eos}
    for key in ("top_p", "top_k", "min_p", "seed"):
        if getattr(args, key) is not None:
            sampling[key] = getattr(args, key)
    stop = tuple(args.stop or ())
    if stop:
        sampling["stop"] = stop
    try:
        SamplingParams.model_validate(sampling)
    except ValidationError as exc:
        raise ValueError("; ".join(
            f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}" for e in exc.errors()
        )) from None
    fields = {k: getattr(args, k) for k in ("num_blocks", "block_size", "deterministic")
              if getattr(args, k, None) is not None}
    if args.speculative_config:
        fields["speculative_config"] = speculative_json(args.speculative_config)
    try:  # every option is checked before the model loads
        config = EngineConfig.model_validate(fields)
    except ValidationError as exc:
        raise ValueError(validation_message(exc, flag_name, EngineConfig)) from None
    options = {"model": args.model, "dtype": args.dtype, "device": args.device, "kv_memory_gb": args.kv_memory_gb,
               "threads": args.threads}
    executor = make_executor({"executor": "torch", **options})
    if executor.tokenizer is None:
        raise ValueError(f"--model {args.model}: has no tokenizer, cannot encode text prompts")
    config = fit_config(config, executor, set(fields))
    chat = use_chat_template(executor.tokenizer, args.chat, args.raw)
    engine = Engine(config, executor)
    ids = [str(i) for i in range(len(args.prompts))]
    try:
        for rid, prompt in zip(ids, args.prompts):
            request = {"request_id": rid, "prompt_token_ids": _encode(executor.tokenizer, prompt, chat),
                       "sampling": sampling}
            try:
                engine.add_request(request)
            except ValidationError as exc:
                problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
                raise ValueError(f"prompt {int(rid) + 1}: {problems}") from None
        ended = _stream(engine, ids, args.prompts, _TextStream(executor.tokenizer, stop))
    finally:
        engine.close()
    for i, rid in enumerate(ids):
        why = empty_output_reason(ended[rid], executor.tokenizer) if rid in ended else None
        if why is not None:
            label = f"prompt {i + 1}" if len(ids) > 1 else "the prompt"
            hint = "" if chat or not getattr(executor.tokenizer, "chat_template", None) else (
                "; --raw was given: without it the prompt is the user turn of the model's chat template")
            print(f"metroline: {label} generated no text: {why}{hint}", file=sys.stderr)
    return 0


def empty_output_reason(out: Any, tokenizer: Any) -> str | None:
    """Why the finished output `out` has no text (`finished by EOS after 0 tokens`, or the
    tokens it had that decode to nothing); None when it has text."""
    text = getattr(out, "text", None)
    if text is None:
        text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
    if text.strip():
        return None
    reason = out.finish_reason
    n = len(out.token_ids) - (reason is FinishReason.EOS)  # the EOS token is not an output token
    why = f"finished by {str(reason).upper() if reason is FinishReason.EOS else reason} after {n} token{'s' * (n != 1)}"
    if n and not text:
        why += " that decode to no text"
    elif n:
        why += " of white space"
    return why


def _stream(engine: Any, ids: list[str], prompts: list[str], texts: _TextStream) -> dict[str, Any]:
    """Print each request's text as it grows; with several prompts, one after the other under a
    header, the later ones buffered until their turn. Returns each request's final output."""
    out = sys.stdout
    several = len(ids) > 1
    pending = {rid: [] for rid in ids}
    finished: set[str] = set()
    ended: dict[str, Any] = {}
    turn = 0

    def show(i: int) -> None:
        if several:
            out.write(f"{'' if i == 0 else chr(10)}[{i + 1}] {prompts[i]}\n")
        out.write("".join(pending.pop(ids[i])))

    show(0)
    out.flush()
    for o in engine.stream():
        piece = texts.new_text(o)
        rid = o.request_id
        if rid == ids[turn]:
            if piece:
                out.write(piece)
                out.flush()
        else:
            pending[rid].append(piece)
        if o.finished:
            finished.add(rid)
            ended[rid] = o
        while ids[turn] in finished and turn + 1 < len(ids):
            turn += 1
            show(turn)
            out.flush()
    out.write("\n")
    out.flush()
    return ended
