"""`EngineConfig`: every knob of the scheduler and the KV pool, validated by pydantic."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .speculative_config import SpeculativeConfig

PreemptionMode = Literal["recompute", "swap"]
AdmissionGate = Literal["full_prompt", "first_chunk"]
PrefixMatch = Literal["block", "token"]
SpeculativeScheduling = Literal["lean", "vllm"]
BudgetMode = Literal["split", "one"]

PRESETS_FILE = Path(__file__).with_name("presets.toml")
"""Presets as data: one table per preset, of `EngineConfig` fields (and a `description`)."""


def presets() -> dict[str, dict[str, Any]]:
    """The shipped presets by name (from `presets.toml`)."""
    return tomllib.loads(PRESETS_FILE.read_text())


def preset_plugin_options(preset: dict[str, dict[str, Any]], data: dict[str, Any]) -> dict[str, Any]:
    """`data`'s `plugin_options` with the preset's tables under them, for the plugins `data` loads
    only (a preset's `[NAME.plugin_options.priority]` applies when the policy is priority); an
    option given explicitly wins over the preset's."""
    given = dict(data.get("plugin_options") or {})
    loaded = {data.get("policy"), *(data.get("plugins") or ())}
    for name, table in preset.items():
        if name in loaded and isinstance(given.get(name, {}), dict):
            given[name] = {**table, **given.get(name, {})}
    return given


def preset_fields(name: str) -> dict[str, Any]:
    """The `EngineConfig` fields a preset sets; ValueError naming the valid presets if unknown."""
    table = presets()
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(sorted(table))}")
    return {k: v for k, v in table[name].items() if k != "description"}

MAX_BLOCKS = 1 << 22
"""The most KV blocks (device pool or host swap space) a config may ask for: the pool's
bookkeeping takes about 75 bytes a block, so this bounds it to about 300 MB."""
MAX_TOKENS = 1 << 24
"""The most tokens a length limit may name (max_model_len, the step budget): 16M."""


class ConfigError(ValueError):
    """A config file that cannot be read or parsed; the message names the file (and the line)."""


class EngineConfig(BaseModel):
    """Configuration of one engine.

    Token budget: each step schedules at most `max_num_batched_tokens` tokens (prefill chunks and
    decodes together) for at most `max_num_seqs` running requests; one prefill chunk is at most
    `max_prefill_chunk` tokens (defaults to the whole budget). `max_prefill_chunk` is vLLM's
    `long_prefill_token_threshold`: it applies only in a step that starts with more than one
    request (running, waiting or swapped); `max_prefill_chunk_adaptive` (vLLM's
    `long_prefill_token_threshold_adaptive`) raises it to `max_num_batched_tokens // requests`
    when that is larger (`chunk_cap`).

    Plugins: `policy` names the base policy (a shipped one, an entry point, or a dotted path);
    `plugins` lists more plugins stacked on top of it, later ones taking precedence;
    `plugin_options` maps a plugin's name to its table of options, validated when the plugin is
    loaded against the plugin's `Options` model (`metroline plugins` lists them).

    Fidelity options (what real engines do; defaults follow vLLM v1, see docs/guide/fidelity.md):

    - `admit_after_preemption` (default False): whether a step that preempted a request may still
      admit waiting ones. vLLM v1 admits nothing in such a step (`if not preempted_reqs:` before its
      waiting loop); admitting would hand the blocks just freed to a new request and preempt again
      soon after (thrashing). True is the older behaviour (vLLM v0's swap-in/prefill after preempt).
    - `admission_gate` (default "full_prompt"): "full_prompt" admits a waiting request only if the
      blocks of its whole prompt (minus its prefix-cache hit) fit in the free blocks, as vLLM 0.33
      (`scheduler_reserve_full_isl=True`, its default) and SGLang (whose prefill adder checks the
      whole input against the free tokens); "first_chunk" checks only the blocks of the chunk it
      gets this step (vLLM before 0.11), and admits more, to be preempted later.
    - `prefix_match` (default "block"): "block" shares only whole cached blocks, as vLLM v1's
      prefix caching; "token" may also share a block that the prompt matches in part (copied on
      its first write), as a radix cache with one-token pages (SGLang) reuses any common prefix.
      Block granularity is the default because the part-match costs a block copy to save at most
      `block_size - 1` tokens, and two unrelated prompts that start with the same token would
      "share" one.
    - `protect_stalled` (default True): the core's no-livelock rule (`select_victim`): a request
      preempted twice in a row without progress is not displaced for a younger requester. vLLM
      has no such rule (its fcfs and priority victims cannot livelock: the first running request,
      or the most urgent, is never another's victim), and the vllm preset turns it off; with
      plugins that may livelock, keep it on.
    - `deterministic` (default False): batch-invariant numerics on a real executor (the torch
      executor's `invariant_step`): a request's tokens and logprobs are bitwise the same whatever
      its companions, its chunking, its place in the batch, the policy, preemptions and prefix
      hits, at a throughput cost. The simulated executor has no numbers to fix and ignores it.
    - `speculative_config` (default None: no speculation): speculative decoding in vLLM's shape
      (`metroline.core.speculative_config`); a running decode then carries up to
      `num_speculative_tokens` draft tokens a step, as the `num_draft_tokens` hook decides.
    - `speculative_scheduling` (default "lean"): how drafts are scheduled
      (`metroline.core.step.speculation`). "lean": drafts never preempt (a decode whose drafts do
      not fit in the free blocks runs without them), a decode gets no more drafts than its
      `max_tokens` leaves room for, and the blocks holding only rejected slots are freed after
      verification. "vllm", as vLLM 0.33's scheduler: a decode's `1 + k` slots are allocated as
      any tokens are, preempting victims when blocks run out; drafts are not cut at `max_tokens`
      (the stop check cuts the accepted run); a request keeps the blocks of its rejected slots
      until it ends or is preempted; and a request admitted one token short of decoding while no
      prefill chunk runs is padded to `1 + k` tokens with drafts that are never accepted.
    - `budget_mode` (default "split"): how the step spends `split_budget`'s shares. "split": the
      decode share is held for the running decodes (and their drafts) and the prefill share for
      prefill chunks, so a long prefill served ahead of decodes never takes their tokens (the
      decodes' pace does not depend on the order), and a split a policy asks for is honoured.
      "one", as vLLM's scheduler: the shares are one budget (their sum) spent in serving order;
      a prefill chunk ahead of decodes may take their tokens, a decode's drafts are cut to what
      is left, and a victim's scheduled tokens go back to that one budget.
    - `enable_chunked_prefill` (default True; vLLM's option of that name): False admits a
      waiting request only when its tokens (within the chunk cap `max_prefill_chunk`, which still
      cuts them, as vLLM's does) fit whole in what is left of the step's budget; the first that
      does not ends admission for the step. It needs `max_num_batched_tokens >= max_model_len`
      (vLLM's rule), so that every request fits in one step.
    - `preset` names a bundle of these fields (`presets.toml`, e.g. "vllm"); fields given
      explicitly override the preset's.

    Types are strict (a bool is not an int, the string "false" is not a bool); the pool sizes are
    at most `MAX_BLOCKS` and the token limits at most `MAX_TOKENS`, checked before anything is
    allocated.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)

    block_size: int = Field(default=16, ge=1, le=1024)
    num_blocks: int = Field(default=8192, ge=1, le=MAX_BLOCKS)
    max_num_seqs: int = Field(default=256, ge=1, le=MAX_BLOCKS)
    max_num_batched_tokens: int = Field(default=2048, ge=1, le=MAX_TOKENS)
    max_prefill_chunk: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    max_prefill_chunk_adaptive: bool = False
    max_model_len: int = Field(default=32768, ge=2, le=MAX_TOKENS)
    enable_prefix_caching: bool = True
    preemption_mode: PreemptionMode = "recompute"
    swap_space_blocks: int = Field(default=0, ge=0, le=MAX_BLOCKS)
    policy: str = "fcfs"
    plugins: list[str] = Field(default_factory=list)
    plugin_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seed: int = 0
    plugin_salt: int = Field(default=0, ge=0)
    debug: bool = False
    admit_after_preemption: bool = False
    admission_gate: AdmissionGate = "full_prompt"
    prefix_match: PrefixMatch = "block"
    protect_stalled: bool = True
    deterministic: bool = False
    preset: str | None = None
    speculative_config: SpeculativeConfig | None = None
    speculative_scheduling: SpeculativeScheduling = "lean"
    budget_mode: BudgetMode = "split"
    enable_chunked_prefill: bool = True

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            fields = preset_fields(data["preset"])
            options = fields.pop("plugin_options", {})
            data = {**fields, **data}
            if options:
                data["plugin_options"] = preset_plugin_options(options, data)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> EngineConfig:
        if self.max_prefill_chunk is not None and self.max_prefill_chunk > self.max_num_batched_tokens:
            raise ValueError(
                f"max_prefill_chunk ({self.max_prefill_chunk}) must not exceed "
                f"max_num_batched_tokens ({self.max_num_batched_tokens})"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"enable_chunked_prefill=false needs max_num_batched_tokens ({self.max_num_batched_tokens}) >= "
                f"max_model_len ({self.max_model_len}): without chunking a request's prompt is computed in one "
                "step; raise max_num_batched_tokens or lower max_model_len"
            )
        if self.preemption_mode == "swap" and self.swap_space_blocks < 1:
            raise ValueError("preemption_mode='swap' needs swap_space_blocks >= 1")
        if self.deterministic and self.speculative_config is not None:
            raise ValueError("speculative decoding is not supported in the deterministic mode (its tiled forward "
                             "verifies no drafts); drop speculative_config or deterministic")
        return self

    @property
    def prefill_chunk(self) -> int:
        """The largest prefill chunk one request may get in one step when several requests are
        eligible (see `chunk_cap`)."""
        return self.max_prefill_chunk or self.max_num_batched_tokens

    def chunk_cap(self, num_requests: int) -> int:
        """The prefill chunk cap of a step that starts with `num_requests` requests (running,
        waiting and swapped, new arrivals included): `max_prefill_chunk`, as vLLM's
        `long_prefill_token_threshold`, only when more than one request is eligible (a request
        alone has nobody to starve and gets the whole budget); with `max_prefill_chunk_adaptive`
        (vLLM's `long_prefill_token_threshold_adaptive`) at least `budget // num_requests`."""
        cap = self.max_prefill_chunk
        budget = self.max_num_batched_tokens
        if cap is None or num_requests <= 1:
            return budget
        if self.max_prefill_chunk_adaptive:
            return max(cap, budget // num_requests)
        return cap

    @property
    def max_kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def options_for(self, *names: str) -> dict[str, Any]:
        """The raw options table given to a plugin under one of its `names` (its name, then its
        spec); an empty dict when none has one. The plugin manager validates it against the
        plugin's `Options` model, if it declares one (`metroline.core.plugins.options`). Tables under two
        of the names are an error (one would be ignored)."""
        given = [name for name in dict.fromkeys(names) if self.plugin_options.get(name)]
        if len(given) > 1:
            raise ValueError(
                f"plugin {names[0]!r}: options given under both {given[0]!r} and {given[1]!r} "
                "in plugin_options; keep one"
            )
        return self.plugin_options[given[0]] if given else {}


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML or JSON file of `EngineConfig` fields (and CLI-only keys) into a dict.

    A `[plugin_options.NAME]` table (TOML) or `"plugin_options": {"NAME": {...}}` (JSON) holds a
    plugin's options.
    """
    path = Path(path)
    text = read_text(path, "config file")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table of config fields, got {type(data).__name__}")
    return data


def read_text(path: Path, what: str) -> str:
    """The text of a UTF-8 file (a byte-order mark is dropped); errors name the file."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start})") from None


class RunOptions(BaseModel):
    """The `[run]` table of a config file and the run flags of `metroline run` / `compare`.

    Strict types, as `EngineConfig`; numbers are finite."""

    model_config = ConfigDict(extra="forbid", strict=True)

    workload: str = "chat"
    executor: str = Field(default="sim", min_length=1)  # sim, torch, an entry point or a dotted path
    cost_model: Literal["steps", "linear", "roofline", "calibrated"] = "roofline"
    step_time: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    cost_params: dict[str, Any] = Field(default_factory=dict)
    rate_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    length_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    max_requests: int | None = Field(default=None, ge=1)
    groups: int | None = Field(default=None, ge=1)
    oracle_lengths: bool = False
    traces_dir: str | None = None
    window: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    warmup: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    horizon: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    resample: str = "redraw"  # how a trace is redrawn for a seed (`metroline.core.workloads.resample`)
    # a real executor's (`--executor torch`)
    model: str | None = None
    dtype: str | None = None
    device: str | None = None
    kv_memory_gb: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    threads: int | None = Field(default=None, ge=1, le=4096)  # None: fits the machine (executors/torch/threads.py)

    @field_validator("resample")
    @classmethod
    def _resample_method(cls, text: str) -> str:
        from .workloads.resample import parse_method

        parse_method(text)
        return text

    @field_validator("cost_params")
    @classmethod
    def _scalars(cls, params: dict[str, Any]) -> dict[str, Any]:
        for key, value in params.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number, got {value}")
            if not isinstance(value, (str, int, float, bool)):
                raise ValueError(f"{key} must be a string, number or boolean, got {value!r:.60}")
        return params
