"""`metroline generate`: text from prompts with a real model, streamed as it is generated."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from .options import fit_config, make_executor


def _encode(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """The token ids of `prompt` (the user turn of a chat template with `chat`)."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("--chat: the model's tokenizer has no chat template")
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
    from ..engine import Engine

    from ..request import SamplingParams

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
    options = {"model": args.model, "dtype": args.dtype, "device": args.device, "kv_memory_gb": args.kv_memory_gb}
    executor = make_executor({"executor": "torch", **options})
    if executor.tokenizer is None:
        raise ValueError(f"--model {args.model}: has no tokenizer, cannot encode text prompts")
    fields = {k: getattr(args, k) for k in ("num_blocks", "block_size") if getattr(args, k) is not None}
    config = EngineConfig.model_validate(fields)
    config = fit_config(config, executor, set(fields))
    engine = Engine(config, executor)
    ids = [str(i) for i in range(len(args.prompts))]
    try:
        for rid, prompt in zip(ids, args.prompts):
            request = {"request_id": rid, "prompt_token_ids": _encode(executor.tokenizer, prompt, args.chat),
                       "sampling": sampling}
            try:
                engine.add_request(request)
            except ValidationError as exc:
                problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
                raise ValueError(f"prompt {int(rid) + 1}: {problems}") from None
        _stream(engine, ids, args.prompts, _TextStream(executor.tokenizer, stop))
    finally:
        engine.close()
    return 0


def _stream(engine: Any, ids: list[str], prompts: list[str], texts: _TextStream) -> None:
    """Print each request's text as it grows; with several prompts, one after the other under a
    header, the later ones buffered until their turn."""
    out = sys.stdout
    several = len(ids) > 1
    pending = {rid: [] for rid in ids}
    finished: set[str] = set()
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
        while ids[turn] in finished and turn + 1 < len(ids):
            turn += 1
            show(turn)
            out.flush()
    out.write("\n")
    out.flush()
