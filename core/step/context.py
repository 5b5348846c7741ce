"""`StepContext`: what every hook can see of the engine, without being able to change it."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..plugins.deprecations import warn_attribute
from ..plugins.preemption import is_protected

if TYPE_CHECKING:
    from ...kv_backends.block_pool import BlockPool
    from ..config import EngineConfig
    from ..requests.logit_masks import LogitMasks
    from ..requests.sequence import Sequence


class StepContext:
    """One long-lived object per engine, updated in place at every step (no per-step allocation).

    Plugin authors read, never write:

    - `now`: the engine clock at the start of the step (virtual seconds in simulation)
    - `step`: the step number (1 for the first step)
    - `config`: the `EngineConfig`
    - `running`, `waiting`, `swapped`: ordered collections of sequences (running in admission
      order, waiting and swapped in the order they got there); support `len`, `in` and iteration
    - `num_free_blocks()`: KV blocks allocatable now (free and evictable cached ones)
    - `block_size`, `num_blocks`
    - `hook`: the hook relay (`PluginManager.hook`), for a plugin that asks other plugins (e.g.
      `srpt` calls `ctx.hook.estimate_output_tokens(ctx=ctx, seq=seq)`)
    - `salt`: the plugins' private randomness for this engine (`EngineConfig.plugin_salt`): a
      plugin that draws random numbers seeds them from it, so two runs of the same config draw
      alike and `compare --aa` can give two arms of one policy independent draws
    - `is_protected(seq)`: whether the core's no-livelock rule protects `seq` (see `select_victim`)
    - `hooks`: deprecated spelling of `hook` (it warns once per plugin; removed in 0.3.0)

    What plugins may ask of it: `wake_at(t)`, and from `sample`, `fail(seq, error)`,
    `ban_tokens(seq, ids)`, `bias_tokens(seq, biases)`, `add_logits_bias(rows, bias)` and
    `adjusted_logits(logits)` (see each; `metroline.core.requests.logit_masks`).
    """

    __slots__ = (
        "now", "step", "config", "running", "waiting", "swapped", "hook", "wakeup", "_pool", "_failures", "_masks",
    )

    def __init__(
        self,
        config: EngineConfig,
        pool: BlockPool,
        running: dict[Sequence, None],
        waiting: dict[Sequence, None],
        swapped: dict[Sequence, None],
    ) -> None:
        self.now = 0.0
        self.step = 0
        self.config = config
        self.running = running.keys()
        self.waiting = waiting.keys()
        self.swapped = swapped.keys()
        self._pool = pool
        self.hook = None
        self.wakeup: float | None = None
        self._failures: list[tuple[Sequence, str]] | None = None
        """The sequences `fail` was asked to end in the `sample` call under way (None outside it)."""
        self._masks: LogitMasks | None = None
        """The bans and biases of the `sample` call under way (None outside it)."""

    @property
    def hooks(self) -> Any:
        """Deprecated since 0.2.0, removed in 0.3.0: use `hook` (`ctx.hook`). Reading it gives
        `hook` and warns once per plugin with a `MetrolineDeprecationWarning`."""
        warn_attribute("StepContext.hooks", getattr(self.hook, "owners", None), sys._getframe(1))
        return self.hook

    def wake_at(self, t: float) -> None:
        """Say that a request this plugin holds back now may be admitted at time `t` (a token
        bucket that refills, a batching window that closes). When a step schedules nothing, the
        workload replay (`core.experiments.runner.replay`) moves the clock to the earliest such
        time, or to the next arrival if it comes first: on a simulated clock time does not pass otherwise. (Empty
        steps still count toward the replay's stall limit while no arrival is pending.) `wakeup`
        holds the earliest time asked for in this step; the scheduler resets it every step.
        """
        if self.wakeup is None or t < self.wakeup:
            self.wakeup = t

    def fail(self, seq: Sequence, error: str) -> None:
        """From a `sample` implementation: end `seq`, one of the sequences being sampled, as failed
        with `error` (a one-line reason, which the request's outcome and the server's error show),
        because it cannot go on (its structured output's grammar reached an error state). The
        engine drops the token the hook gives it, ends it (`FinishReason.FAILED`, `seq.error`) and
        frees its blocks at the step's reap; the other sequences of the step go on, where raising
        an exception would fail every one. Called outside `sample`, it raises `RuntimeError`."""
        if self._failures is None:
            raise RuntimeError("StepContext.fail is for sample implementations, during the sample hook")
        if not any(s is seq for s, _ in self._failures):
            self._failures.append((seq, error))

    def _sampling(self, what: str) -> LogitMasks:
        if self._masks is None:
            raise RuntimeError(f"StepContext.{what} is for sample implementations, during the sample hook")
        return self._masks

    def ban_tokens(self, seq: Sequence, token_ids: Iterable[int]) -> None:
        """From a `sample` wrapper, before it yields: `seq` may not take any of `token_ids` this
        step. The samplers below choose from `adjusted_logits(logits)`, where those logits are -inf
        (in simulation the stand-in tokens skip them); an answer that picks one is a `PluginError`.
        Works the same on every executor; the executor's `logits` are never modified."""
        self._sampling("ban_tokens").ban(seq, token_ids)

    def bias_tokens(self, seq: Sequence, biases: dict[int, float]) -> None:
        """From a `sample` wrapper, before it yields: add `biases[token_id]` to `seq`'s logit of each
        token this step (OpenAI's `logit_bias`; -inf bans the token, as `ban_tokens`)."""
        self._sampling("bias_tokens").bias(seq, biases)

    def add_logits_bias(self, rows: list[int], bias: Any) -> None:
        """From a `sample` wrapper, before it yields: add the tensor `bias` (`[len(rows), vocab]`,
        -inf where a token is forbidden) to the rows `rows` (indices into the hook's `seqs`) of
        the logits, in one batched operation: a grammar's mask for many sequences at once. Only
        where the logits are a tensor (a real executor)."""
        self._sampling("add_logits_bias").add_rows(rows, bias)

    def adjusted_logits(self, logits: Any) -> Any:
        """For a sampler: `logits` with the bans and biases the wrappers registered this step
        applied (a new tensor, computed once per step; `logits` itself when there are none). A
        `sample` implementation that chooses tokens must read these, not the raw `logits`."""
        return logits if self._masks is None else self._masks.apply(logits)

    def banned_tokens(self, seq: Sequence) -> frozenset[int]:
        """The tokens wrappers banned for `seq` this step (`ban_tokens`, or a bias of -inf)."""
        if self._masks is None or not self._masks.banned:
            return frozenset()
        return frozenset(self._masks.banned.get(self._masks.row_of(seq), ()))

    @property
    def salt(self) -> int:
        """The plugins' private randomness: seed a plugin's own random draws from it (see the class)."""
        return self.config.plugin_salt

    @property
    def num_running(self) -> int:
        """How many sequences run now."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """How many sequences wait now (swapped ones not included)."""
        return len(self.waiting)

    @property
    def deterministic(self) -> bool:
        """Whether the engine runs in the deterministic mode (`EngineConfig.deterministic`): a
        `sample` plugin should then draw each row alone (never from a generator the rows share),
        as the default sampler does, so a request's tokens do not depend on its companions."""
        return self.config.deterministic

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        return self._pool.block_size

    @property
    def num_blocks(self) -> int:
        """KV blocks in the pool."""
        return self._pool.num_blocks

    def num_free_blocks(self) -> int:
        """KV blocks allocatable now: free ones and evictable cached ones."""
        return self._pool.num_free_blocks()

    def cached_prefix_tokens(self, seq: Sequence) -> int:
        """How many leading tokens of `seq` the prefix cache holds now (a lookup, no side effects:
        O(prefix blocks); call it for a bounded number of candidates per step)."""
        return self._pool.lookup(seq.token_ids, seq.cache_salt, len(seq.token_ids) - 1).num_tokens

    @staticmethod
    def is_protected(seq: Sequence) -> bool:
        """Whether `seq` is protected by the core's no-livelock rule: preempted twice in a row
        without progress, it is not displaced for a younger request until it computes past the
        most tokens it ever had computed. A `select_victim` that names a protected victim for a
        younger requester gets the core's substitute; a policy can avoid that by skipping them."""
        return is_protected(seq)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self._pool.block_size)
