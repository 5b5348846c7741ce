"""Request files with text, and the outputs file of a run.

A request file is JSONL, one request per line::

    {"id": "q1", "prompt": "Name three metro lines.", "chat": true, "max_new_tokens": 64,
     "temperature": 0.7, "top_p": 0.9, "seed": 1, "stop": ["\\n\\n"], "arrival_s": 0.5}
    {"id": "q2", "prompt_token_ids": [1, 2, 3], "tenant": "beta", "priority": 1, "n": 2}

- the prompt: `prompt` (text, encoded by the executor's tokenizer; with `"chat": true` and a
  tokenizer that has a chat template, it is the user message of a one-turn chat and the template
  is applied with the generation prompt) or `prompt_token_ids`, exactly one of them;
- `id` (default: the line number), `arrival_s` (default 0), `tenant`, `priority`, `metadata`
  (fields for plugins: `Request.metadata`), `deadline_s` (seconds after the arrival by which it
  should finish: plugins see `seq.deadline` = arrival + `deadline_s`, and the run reports the
  share of requests that met theirs);
- the sampling fields of `SamplingParams`: `max_new_tokens`, `temperature`, `top_p`, `top_k`,
  `min_p`, `repetition_penalty`, `frequency_penalty`, `presence_penalty`, `seed`, `stop`,
  `stop_token_ids`, `ignore_eos`, `min_tokens`, `n`, `logprobs` (a real model: the outputs file
  then has each token's log-probability and its `logprobs` top alternatives).

A line with a `prompt` or `prompt_token_ids` key marks a file as a request file (a Mooncake trace
has neither). Errors name the file, the line and the field.

`OutputsWriter` is an observer plugin that writes one JSON line per finished sequence.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..plugins.hookspecs import hookimpl
from ..requests.request import METADATA_MAX_KEYS, MetadataKey, MetadataValue, SamplingParams
from ..requests.sequence import Sequence
from .items import Workload, WorkloadError

SAMPLING_KEYS = tuple(SamplingParams.model_fields)


class _Line(BaseModel):
    """The fields of a line that are not sampling fields."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, Field(min_length=1)] | int | None = None
    prompt: str | None = None
    prompt_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, min_length=1)
    chat: bool = False
    arrival_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    tenant: str = Field(default="default", min_length=1)
    priority: int = 0
    metadata: dict[MetadataKey, MetadataValue] = Field(default_factory=dict, max_length=METADATA_MAX_KEYS)
    deadline_s: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)


@dataclass(slots=True, frozen=True)
class TextRequestItem:
    """One request of a request file: a `WorkloadItem` look-alike whose prompt and sampling are
    given, not generated (`replay` submits it as is)."""

    arrival_s: float
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    tenant: str = "default"
    priority: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Fields for plugins (`Request.metadata`)."""
    deadline_s: float | None = None
    """Seconds after the arrival by which the request should finish (None: no deadline)."""

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_len(self) -> int:
        return self.sampling.max_new_tokens

    def request_data(self, request_id: str, *, vocab_size: int = 32000, oracle: bool = False) -> dict[str, Any]:
        """The fields of its `Request` (its own id; `request_id` and `vocab_size` are unused).
        With `oracle`, policies are told `max_new_tokens` when EOS cannot end it earlier."""
        known = oracle and self.sampling.ignore_eos and not self.sampling.stop and not self.sampling.stop_token_ids
        return {
            "request_id": self.request_id,
            "tenant": self.tenant,
            "priority": self.priority,
            "arrival_time": self.arrival_s,
            "prompt_token_ids": list(self.prompt_token_ids),
            "sampling": self.sampling,
            "expected_output_tokens": self.sampling.max_new_tokens if known else None,
            "metadata": dict(self.metadata),
            "deadline": None if self.deadline_s is None else self.arrival_s + self.deadline_s,
        }


def is_request_file(path: str | Path) -> bool:
    """Whether the first non-empty line of the JSONL file `path` is a request (has `prompt` or
    `prompt_token_ids`)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    first = json.loads(line)
                except ValueError:
                    return False
                return isinstance(first, dict) and ("prompt" in first or "prompt_token_ids" in first)
    return False


def _problems(err: ValidationError, prefix: str = "") -> str:
    return "; ".join(f"{prefix}{'.'.join(str(p) for p in e['loc']) or 'line'}: {e['msg']}" for e in err.errors())


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """`prompt`'s token ids; with `chat` and a chat template, as the user turn of a chat ready
    for the assistant's answer."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if not isinstance(ids, list):  # a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer.encode(prompt))


def parse_line(data: Any, where: str, default_id: str, tokenizer: Any = None) -> TextRequestItem:
    """One request from the decoded JSON of a line; errors start with `where` ("file:line")."""
    if not isinstance(data, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(data).__name__}")
    sampling_data = {k: data[k] for k in SAMPLING_KEYS if k in data}
    rest = {k: v for k, v in data.items() if k not in sampling_data}
    problems = []
    try:
        line = _Line.model_validate(rest)
    except ValidationError as e:
        problems.append(_problems(e))
    try:
        sampling = SamplingParams.model_validate(sampling_data)
    except ValidationError as e:
        problems.append(_problems(e))
    if problems:
        raise WorkloadError(f"{where}: {'; '.join(problems)}")
    if (line.prompt is None) == (line.prompt_token_ids is None):
        raise WorkloadError(f"{where}: give exactly one of prompt (text) and prompt_token_ids")
    if line.prompt is not None:
        if tokenizer is None:
            raise WorkloadError(
                f"{where}: prompt: a text prompt needs a tokenizer and this executor has none "
                "(give prompt_token_ids, or run a real model)"
            )
        ids = encode_prompt(tokenizer, line.prompt, line.chat)
        if not ids:
            raise WorkloadError(f"{where}: prompt: the text encodes to no tokens")
    else:
        ids = line.prompt_token_ids
    if sampling.stop and tokenizer is None:
        raise WorkloadError(f"{where}: stop: stop strings need a tokenizer and this executor has none")
    rid = default_id if line.id is None else str(line.id)
    return TextRequestItem(line.arrival_s, rid, tuple(ids), sampling, line.tenant, line.priority, line.metadata,
                           line.deadline_s)


def load_requests(path: str | Path, tokenizer: Any = None) -> list[TextRequestItem]:
    """The requests of the request file `path`, in file order (ids default to line numbers)."""
    path = Path(path)
    items: list[TextRequestItem] = []
    lines: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"{path}: cannot read request file: {e}") from None
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise WorkloadError(f"{where}: invalid JSON: {e}") from None
        item = parse_line(data, where, str(number), tokenizer)
        if item.request_id in lines:
            raise WorkloadError(f"{where}: id: {item.request_id!r} is already the id of line {lines[item.request_id]}")
        lines[item.request_id] = number
        items.append(item)
    if not items:
        raise WorkloadError(f"{path}: the request file has no requests")
    return items


def request_workload(
    path: str | Path,
    tokenizer: Any = None,
    *,
    rate_scale: float = 1.0,
    length_scale: float = 1.0,
    max_requests: int | None = None,
) -> Workload:
    """A `Workload` of the request file `path`: the first `max_requests` by arrival, arrivals
    divided by `rate_scale`. Lengths are the requests' own (`length_scale` must be 1)."""
    path = Path(path)
    if length_scale != 1.0:
        raise WorkloadError(f"{path}: length_scale does not apply to a request file (its prompts are given)")
    items = sorted(load_requests(path, tokenizer), key=lambda it: it.arrival_s)[:max_requests]
    if rate_scale != 1.0:
        items = [
            TextRequestItem(it.arrival_s / rate_scale, it.request_id, it.prompt_token_ids, it.sampling,
                            it.tenant, it.priority, it.metadata, it.deadline_s)
            for it in items
        ]
    params = {"source": str(path), "rate_scale": rate_scale, "length_scale": 1.0, "max_requests": max_requests}
    return Workload(path.stem, items, f"requests {path.name}", params)  # type: ignore[arg-type]


def output_record(seq: Sequence) -> dict[str, Any]:
    """The outputs-file line of a finished sequence: `id`, `index` (for `n > 1` only),
    `prompt_token_ids`, `output_token_ids`, `text` (None without a tokenizer), `finish_reason`
    (and `error` when it failed; `logprobs` when the line asked for them: per output token
    `[logprob, [[token, logprob], ...]]`)."""
    record: dict[str, Any] = {"id": seq.request_id}
    if seq.sampling.n > 1:
        record["index"] = seq.index
    record.update(
        prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
        output_token_ids=seq.output_token_ids,
        text=seq.text,
        finish_reason=str(seq.finish_reason) if seq.finish_reason is not None else None,
    )
    if seq.error:
        record["error"] = seq.error
    if seq.logprobs is not None:
        record["logprobs"] = [[lp, [list(t) for t in top]] for lp, top in seq.logprobs]
    return record


class OutputsWriter:
    """An observer plugin that writes `output_record(seq)` as a JSON line for every sequence as it
    finishes (so in finishing order), into a temporary file beside `path` that replaces `path`
    once the run ends (`close()`): a previous file stays whole until then, and a run that fails
    leaves it as it was (`abandon()`). Only a regular file (or nothing) at `path` is replaced."""

    name = "outputs"

    def __init__(self, path: str | Path) -> None:
        from ..results.files import atomic_open

        self.path = Path(path)
        self._writing = atomic_open(self.path, "--outputs")
        self._file = self._writing.__enter__()
        self.count = 0

    @hookimpl
    def on_finished(self, seqs: list[Sequence]) -> None:
        write = self._file.write
        for seq in seqs:
            write(json.dumps(output_record(seq), ensure_ascii=False) + "\n")
        self.count += len(seqs)

    def close(self) -> None:
        """The lines written replace `path`."""
        self._writing.__exit__(None, None, None)

    def abandon(self, exc: BaseException) -> None:
        """The run failed: `path` is left as it was."""
        self._writing.__exit__(type(exc), exc, exc.__traceback__)
