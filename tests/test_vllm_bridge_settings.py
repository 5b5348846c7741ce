"""`metroline.integrations.vllm` without vLLM: the `--additional-config` section, the version
range, and the start-up refusal of hooks vLLM cannot honour (the scheduler itself is tested with
vLLM in tests/integration_vllm/)."""

from __future__ import annotations

import types

import pytest

from metroline.core.plugins.manager import PluginManager
from metroline.api import hookimpl
from metroline.core.config import EngineConfig
from metroline.integrations.vllm import SUPPORTED_VLLM, check_vllm_version, settings_from_additional_config
from metroline.integrations.vllm.settings import BridgeConfigError
from metroline.integrations.vllm.support import SUPPORT, UnsupportedHookError, refuse_unsupported


class Greedy:
    """A sample plugin (vLLM samples on its workers: refused)."""

    @hookimpl
    def sample(self, seqs):
        return [0] * len(seqs)


def vllm_config(policy="fcfs", threshold=0, prefix=True):
    sched = types.SimpleNamespace(policy=policy, max_num_seqs=16, max_num_batched_tokens=512,
                                  long_prefill_token_threshold=threshold, long_prefill_token_threshold_adaptive=False)
    return types.SimpleNamespace(scheduler_config=sched, model_config=types.SimpleNamespace(max_model_len=4096),
                                 cache_config=types.SimpleNamespace(enable_prefix_caching=prefix))


def test_no_section_is_vllms_own_policy_under_the_vllm_preset():
    s = settings_from_additional_config(None)
    cfg = s.engine_config(vllm_config(), num_blocks=100, block_size=16)
    assert (cfg.policy, cfg.plugins, cfg.num_blocks, cfg.block_size) == ("fcfs", [], 100, 16)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len) == (16, 512, 4096)
    assert (cfg.admit_after_preemption, cfg.protect_stalled, cfg.max_prefill_chunk) == (False, False, None)
    cfg = s.engine_config(vllm_config(policy="priority", threshold=128), num_blocks=100, block_size=16)
    assert (cfg.policy, cfg.max_prefill_chunk) == ("priority", 128)
    assert cfg.options_for("priority", "priority") == {"vllm": True}


def test_the_section_and_a_file_it_names(tmp_path):
    f = tmp_path / "policy.toml"
    f.write_text('policy = "srpt"\nplugins = ["tenant_quota"]\n[plugin_options.srpt]\nmax_wait_s = 30.0\n')
    s = settings_from_additional_config({"metroline": {"config": str(f), "plugins": []}})
    assert (s.policy, s.plugins, s.plugin_options) == ("srpt", [], {"srpt": {"max_wait_s": 30.0}})
    cfg = s.engine_config(vllm_config(), 64, 16)
    assert (cfg.policy, cfg.plugins) == ("srpt", [])


@pytest.mark.parametrize("section, message", [
    ({"num_blocks": 4}, "additional_config.metroline.num_blocks: the engine's num_blocks is vLLM's own"),
    ({"max_num_seqs": 4}, "--max-num-seqs"),
    ({"polcy": "srpt"}, "additional_config.metroline.polcy: unknown key"),
    ({"policy": 3}, "additional_config.metroline.policy must be a string"),
    ({"plugins": "quota"}, "additional_config.metroline.plugins must be a list of strings"),
    ({"plugin_options": {"srpt": 1}}, "plugin_options must map plugin names to tables"),
    ({"plugin_salt": True}, "plugin_salt must be an int"),
])
def test_a_bad_section_names_the_key(section, message):
    with pytest.raises(BridgeConfigError, match=message.replace(".", r"\.").replace("-", r"\-")):
        settings_from_additional_config({"metroline": section})


def test_the_version_range():
    assert SUPPORTED_VLLM == ((0, 32), (0, 34))
    assert check_vllm_version("0.32.0+cpu") == "0.32.0+cpu"
    assert check_vllm_version("0.33.1") == "0.33.1"
    for bad in ("0.31.2", "0.34.0", "1.0.0"):
        with pytest.raises(RuntimeError, match=f"supports vLLM >= 0.32, < 0.34; vLLM {bad} is installed"):
            check_vllm_version(bad)


def test_a_version_reads_as_major_and_the_digits_of_its_minor():
    from metroline.integrations.vllm.versions import parse_version

    assert parse_version("0.33.1rc1") == (0, 33)
    assert parse_version("0.32.0+cpu") == (0, 32)
    assert parse_version("1.dev") == (1, 0)  # a minor with no digit reads as 0
    for bad in ("", "cpu", "x.32"):
        with pytest.raises(RuntimeError, match=f"cannot read vLLM's version {bad!r}"):
            parse_version(bad)


def test_every_hook_has_a_level_and_those_vllm_cannot_honour_are_refused_by_name():
    from metroline.core.plugins.loader import HOOK_NAMES

    assert set(SUPPORT) == set(HOOK_NAMES)
    assert {h for h, (level, _) in SUPPORT.items() if level == "not"} == {"sample", "num_draft_tokens", "route"}
    refuse_unsupported(PluginManager(EngineConfig(preset="vllm", policy="srpt", plugins=["tenant_quota"])))
    with pytest.raises(UnsupportedHookError, match="plugin 'Greedy' implements 'sample'"):
        refuse_unsupported(PluginManager(EngineConfig(preset="vllm"), extra=[Greedy()]))
    with pytest.raises(UnsupportedHookError, match="plugin 'adaptive_speculation' implements 'num_draft_tokens'"):
        refuse_unsupported(PluginManager(EngineConfig(preset="vllm", plugins=["adaptive_speculation"])))
