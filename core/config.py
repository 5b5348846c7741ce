"""`EngineConfig`: every knob of the scheduler and the KV pool, validated by pydantic."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PreemptionMode = Literal["recompute", "swap"]
AdmissionGate = Literal["full_prompt", "first_chunk"]
PrefixMatch = Literal["block", "token"]

PRESETS_FILE = Path(__file__).with_name("presets.toml")
"""Presets as data: one table per preset, of `EngineConfig` fields (and a `description`)."""


def presets() -> dict[str, dict[str, Any]]:
    """The shipped presets by name (from `presets.toml`)."""
    return tomllib.loads(PRESETS_FILE.read_text())


def preset_fields(name: str) -> dict[str, Any]:
    """The `EngineConfig` fields a preset sets; ValueError naming the valid presets if unknown."""
    table = presets()
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(sorted(table))}")
    return {k: v for k, v in table[name].items() if k != "description"}


class EngineConfig(BaseModel):
    """Configuration of one engine.

    Token budget: each step schedules at most `max_num_batched_tokens` tokens (prefill chunks and
    decodes together) for at most `max_num_seqs` running requests; one prefill chunk is at most
    `max_prefill_chunk` tokens (defaults to the whole budget).

    Plugins: `policy` names the base policy (a shipped one, an entry point, or a dotted path);
    `plugins` lists more plugins stacked on top of it, later ones taking precedence;
    `plugin_options` maps a plugin's name to the options it reads (see each plugin's docstring).

    Fidelity options (what real engines do; defaults follow vLLM v1, see the README):

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
    - `preset` names a bundle of these fields (`presets.toml`, e.g. "vllm"); fields given
      explicitly override the preset's.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    block_size: int = Field(default=16, ge=1, le=1024)
    num_blocks: int = Field(default=8192, ge=1)
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    max_prefill_chunk: int | None = Field(default=None, ge=1)
    max_model_len: int = Field(default=32768, ge=2)
    enable_prefix_caching: bool = True
    preemption_mode: PreemptionMode = "recompute"
    swap_space_blocks: int = Field(default=0, ge=0)
    policy: str = "fcfs"
    plugins: list[str] = Field(default_factory=list)
    plugin_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seed: int = 0
    debug: bool = False
    admit_after_preemption: bool = False
    admission_gate: AdmissionGate = "full_prompt"
    prefix_match: PrefixMatch = "block"
    preset: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            data = {**preset_fields(data["preset"]), **data}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> EngineConfig:
        if self.max_prefill_chunk is not None and self.max_prefill_chunk > self.max_num_batched_tokens:
            raise ValueError(
                f"max_prefill_chunk ({self.max_prefill_chunk}) must not exceed "
                f"max_num_batched_tokens ({self.max_num_batched_tokens})"
            )
        if self.preemption_mode == "swap" and self.swap_space_blocks < 1:
            raise ValueError("preemption_mode='swap' needs swap_space_blocks >= 1")
        return self

    @property
    def prefill_chunk(self) -> int:
        """The largest prefill chunk one request may get in one step."""
        return self.max_prefill_chunk or self.max_num_batched_tokens

    @property
    def max_kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def options_for(self, plugin_name: str) -> dict[str, Any]:
        """The options given to one plugin (an empty dict when none were)."""
        return self.plugin_options.get(plugin_name, {})


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML or JSON file of `EngineConfig` fields (and CLI-only keys) into a dict.

    A `[plugin_options.NAME]` table (TOML) or `"plugin_options": {"NAME": {...}}` (JSON) holds a
    plugin's options.
    """
    path = Path(path)
    text = path.read_text()
    if path.suffix.lower() == ".json":
        data = json.loads(text)
    else:
        data = tomllib.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a table of config fields")
    return data
