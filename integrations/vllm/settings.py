"""The bridge's settings: the policy stack, from vLLM's `additional_config` and vLLM's own engine
sizes, as a metroline `EngineConfig`.

    --additional-config '{"metroline": {"policy": "srpt", "plugins": ["tenant_quota"],
                          "plugin_options": {"srpt": {"max_wait_s": 30}}}}'
    --additional-config '{"metroline": {"config": "policy.toml"}}'

`config` names a TOML or JSON file holding the same keys (`policy`, `plugins`, `plugin_options`);
keys given beside it override the file's. The engine's sizes (blocks, block size, sequences, token
budget, model length, chunk cap, prefix caching) are vLLM's own flags and are never read from
here: a key for one is refused, naming the vLLM flag. The stack is built under `--preset vllm`, so
the options the preset gives (`priority`'s `vllm = true`) apply as in the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KEYS = ("policy", "plugins", "plugin_options", "config", "plugin_salt")
ENGINE_FLAGS = {  # metroline's field -> the vLLM flag that sets it
    "num_blocks": "--num-gpu-blocks-override / the KV cache size", "block_size": "--block-size",
    "max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_model_len": "--max-model-len", "max_prefill_chunk": "--long-prefill-token-threshold",
    "enable_prefix_caching": "--enable-prefix-caching", "speculative_config": "--speculative-config",
    "preset": "(none: the bridge always runs under the vllm preset)",
}


class BridgeConfigError(ValueError):
    """A bad `additional_config["metroline"]` section; the message names the key."""


@dataclass
class BridgeSettings:
    """The policy stack: a policy, stacked plugins (lowest precedence first) and their options."""

    policy: str | None = None
    plugins: list[str] = field(default_factory=list)
    plugin_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    plugin_salt: int | None = None

    def engine_config(self, vllm_config: Any, num_blocks: int, block_size: int) -> Any:
        """metroline's `EngineConfig` for these settings and vLLM's engine (`vllm_config`, a
        `VllmConfig`; `num_blocks` the blocks for requests, vLLM's null block excluded)."""
        from metroline.core.config import EngineConfig

        sched = vllm_config.scheduler_config
        policy = self.policy or ("priority" if str(getattr(sched.policy, "value", sched.policy)) == "priority" else "fcfs")
        fields: dict[str, Any] = dict(
            preset="vllm", policy=policy, plugins=list(self.plugins), plugin_options=dict(self.plugin_options),
            num_blocks=max(1, num_blocks), block_size=block_size, max_num_seqs=sched.max_num_seqs,
            max_num_batched_tokens=sched.max_num_batched_tokens, max_model_len=vllm_config.model_config.max_model_len,
            max_prefill_chunk=sched.long_prefill_token_threshold or None,
            enable_prefix_caching=bool(vllm_config.cache_config.enable_prefix_caching),
        )
        if getattr(sched, "long_prefill_token_threshold_adaptive", False):
            fields["max_prefill_chunk_adaptive"] = True
        if self.plugin_salt is not None:
            fields["plugin_salt"] = self.plugin_salt
        return EngineConfig(**fields)


def settings_from_additional_config(additional: dict[str, Any] | None) -> BridgeSettings:
    """The settings in `additional["metroline"]` (vLLM's `VllmConfig.additional_config`); the
    defaults (vLLM's own policy) when there is none. Raises `BridgeConfigError` naming a bad key."""
    section = (additional or {}).get("metroline")
    if section is None:
        return BridgeSettings()
    if not isinstance(section, dict):
        raise BridgeConfigError(f"additional_config.metroline must be a table, got {type(section).__name__}")
    merged: dict[str, Any] = {}
    if "config" in section:
        from metroline.core.config import load_config_file

        path = section["config"]
        if not isinstance(path, str):
            raise BridgeConfigError(f"additional_config.metroline.config must be a file path, got {path!r}")
        merged.update(load_config_file(path))
        merged.pop("run", None)  # a metroline config file's run flags: not the scheduler's
    merged.update({k: v for k, v in section.items() if k != "config"})
    for key in merged:
        if key in ENGINE_FLAGS:
            raise BridgeConfigError(
                f"additional_config.metroline.{key}: the engine's {key} is vLLM's own ({ENGINE_FLAGS[key]})")
        if key not in KEYS:
            raise BridgeConfigError(
                f"additional_config.metroline.{key}: unknown key (known: {', '.join(KEYS)})")
    policy, plugins = merged.get("policy"), merged.get("plugins", [])
    options, salt = merged.get("plugin_options", {}), merged.get("plugin_salt")
    if policy is not None and not isinstance(policy, str):
        raise BridgeConfigError(f"additional_config.metroline.policy must be a string, got {policy!r}")
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise BridgeConfigError(f"additional_config.metroline.plugins must be a list of strings, got {plugins!r}")
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise BridgeConfigError(
            "additional_config.metroline.plugin_options must map plugin names to tables of options")
    if salt is not None and (not isinstance(salt, int) or isinstance(salt, bool)):
        raise BridgeConfigError(f"additional_config.metroline.plugin_salt must be an int, got {salt!r}")
    return BridgeSettings(policy, list(plugins), dict(options), salt)
