"""`EngineConfig`: every knob of the scheduler and the KV pool, validated by pydantic."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PreemptionMode = Literal["recompute", "swap"]


class EngineConfig(BaseModel):
    """Configuration of one engine.

    Token budget: each step schedules at most `max_num_batched_tokens` tokens (prefill chunks and
    decodes together) for at most `max_num_seqs` running requests; one prefill chunk is at most
    `max_prefill_chunk` tokens (defaults to the whole budget).

    Plugins: `policy` names the base policy (a shipped one, an entry point, or a dotted path);
    `plugins` lists more plugins stacked on top of it, later ones taking precedence;
    `plugin_options` maps a plugin's name to the options it reads (see each plugin's docstring).
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
