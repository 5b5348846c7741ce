"""The executor protocol: what the engine needs from whatever runs a step plan.

An executor owns the engine's clock. The simulator's clock is virtual (a cost model says how long a
step takes); a real executor's clock is the wall clock.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..core.step.plan import StepPlan, StepResult
from ..kv_backends.block_ops import COPY, NAMES, SWAP_IN, SWAP_OUT


@runtime_checkable
class Executor(Protocol):
    """Runs step plans and keeps the engine's clock.

    - `name`: `"sim"` or `"torch"`, for results and logs.
    - `now()`: the engine clock in seconds (virtual for the simulator, wall for a real executor).
    - `execute(plan)`: runs the plan's block ops in order, then the forward pass; returns the clock
      after the step and one logits row per `plan.sample_seqs` (None in the simulator). The step
      writes all of its KV before any attention of the step reads KV: the scheduler indexes the
      blocks a step fills when it schedules them, and a request admitted later in the same step
      may share them (its attention reads them in the same forward). No block op of the plan
      (a copy or a swap-out, which run before the forward) reads such a slot for a sequence
      that counts it as computed: the KV backend states and checks it (`BlockPool.pending`,
      `metroline.kv_backends.pending`; a swap-out that would is refused and its victim
      recomputed), so an executor may run the ops as plain copies.
    - `idle_until(t)`: nothing to run before time `t` (the next arrival): the simulator jumps its
      clock to `max(now(), t)`, a real executor sleeps.
    - `describe()`: a JSON-ready dict for the result document's `"executor"` field, at least
      `{"name": ..., "cost_model": {...}}` (a real executor may give `"cost_model": None`).

    A real model adds (the engine uses each when present, see `RealExecutor`): `bind(config)`,
    `close()`, `eos_token_id`, `vocab_size`, `max_model_len`, `tokenizer`, `sampler_class`,
    `sample_mode`, `plugins()`, `kv_bytes_per_token` and `suggest_num_blocks(block_size)`.
    """

    name: str

    def now(self) -> float: ...

    def execute(self, plan: StepPlan) -> StepResult: ...

    def idle_until(self, t: float) -> None: ...

    def describe(self) -> dict: ...


@runtime_checkable
class RealExecutor(Executor, Protocol):
    """An executor that computes a model: what the engine and the CLI read from it.

    - `bind(config)`: called once by the engine before the first step: allocate the KV blocks the
      engine's pool describes (`config.num_blocks` of `config.block_size` tokens, and
      `config.swap_space_blocks` host blocks); block ids in plans index them.
    - `close()`: release the model's memory and the KV blocks (`Engine.close` calls it).
    - `eos_token_id` (None: none), `vocab_size` (prompts are validated against it),
      `max_model_len` (the model's context length, or None; `max_model_len_reason`, when present,
      says why it is shorter than the model's context), `tokenizer` (or None).
    - `sampler_class`: the sampler the default `sample` hook uses on this executor's logits (a
      subclass of `metroline.core.requests.sampling.Sampler`; the torch executor's `TorchSampler`
      samples logits tensors). Without one, rows of floats are sampled by `Sampler`, and tensors,
      with a deprecation warning, by `TorchSampler`.
    - `sample_mode` (optional): a context manager factory the engine calls the `sample` hook in
      (the torch executor's `torch.inference_mode`, so its logits may be masked in place).
    - `plugins()` (optional): plugin objects the executor brings, which the engine stacks below
      the ones it is given (the torch executor's `structured_output`, which holds requests'
      outputs to a JSON schema on its logits).
    - `kv_bytes_per_token`: 2 x layers x KV heads x head dim x dtype size;
      `suggest_num_blocks(block_size)`: the blocks the executor's memory budget holds (an
      executor whose speculative decoding keeps KV in the pool's blocks also takes
      `speculative_config=`, which `fit_config` passes when the config has one).
    """

    eos_token_id: int | None
    vocab_size: int
    max_model_len: int | None
    tokenizer: object
    kv_bytes_per_token: int

    def bind(self, config: object) -> None: ...

    def close(self) -> None: ...

    def suggest_num_blocks(self, block_size: int) -> int: ...


def count_block_ops(block_ops: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    """`(copies, swap_outs, swap_ins)` in a plan's block ops."""
    if not block_ops:
        return 0, 0, 0
    counts = [0, 0, 0]
    for kind, _, _ in block_ops:
        counts[kind] += 1
    return counts[COPY], counts[SWAP_OUT], counts[SWAP_IN]


class ExecutorStats:
    """Counters an executor keeps over a run: steps executed, seconds busy and idle, block ops.

    `record(plan, duration)` after each executed plan, `record_idle(seconds)` after each idle wait.
    """

    __slots__ = ("total_steps", "busy_time", "idle_time", "copies", "swap_outs", "swap_ins")

    def __init__(self) -> None:
        self.total_steps = 0
        self.busy_time = 0.0
        self.idle_time = 0.0
        self.copies = 0
        self.swap_outs = 0
        self.swap_ins = 0

    def record(self, plan: StepPlan, duration: float) -> None:
        self.total_steps += 1
        self.busy_time += duration
        if plan.block_ops:
            c, o, i = count_block_ops(plan.block_ops)
            self.copies += c
            self.swap_outs += o
            self.swap_ins += i

    def record_idle(self, seconds: float) -> None:
        self.idle_time += seconds

    def as_dict(self) -> dict:
        return {
            "total_steps": self.total_steps,
            "busy_time": self.busy_time,
            "idle_time": self.idle_time,
            "block_ops": {
                NAMES[COPY]: self.copies,
                NAMES[SWAP_OUT]: self.swap_outs,
                NAMES[SWAP_IN]: self.swap_ins,
            },
        }
