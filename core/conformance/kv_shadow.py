"""`KVShadow`: a shadow model of every KV slot, checked at every step (an executor wrapper).

The shadow holds, for each device slot (block, offset) and each host slot, the identity of the KV
written there: the exact prefix of tokens it was computed from (a node of a trie of token
prefixes, rooted at the request's `cache_salt`, so a position is part of the identity). It runs
each plan the way an executor must (`metroline.executors.base.Executor`):

1. the plan's block operations, in order: a copy or a swap copies the source's slots;
2. the step's writes: every scheduled token's KV lands in its slot (a draft token's slot holds a
   draft label until verification accepts it: then its token's prefix, as the KV of a draft equal
   to the token is that token's; a rejected draft's label stays until the slot is written again).
   A draft counts as accepted when the engine appended a token after it and, on the simulator,
   when the executor's acceptance (`StepResult.accepted`) covered it;
3. the step's reads: every scheduled sequence attends to every position before its last
   scheduled one (`0 .. start + n - 1`, drafts excepted), and each slot must hold exactly that
   sequence's own prefix at that position.

It also checks, after the block operations, that the host copy of every sequence swapped out in
the step holds its computed prefix (the KV it will read when it is swapped back in); with an
engine attached (`attach`), the pool's invariants against the live block tables and the host
blocks against the swapped sequences' host tables, before each step; and `check_drained` finds
leaked blocks (device or host) once every request ended.

A wrong read is recorded in `errors` (the engine turns an exception raised inside `execute` into
failed requests, so the shadow does not raise); `assert_clean` raises the first. It wraps any
executor (the simulator by default, the torch executor too): every other attribute is the inner
executor's.

    shadow = KVShadow()
    engine = shadow.attach(Engine(config, shadow))
    engine.generate(requests)
    shadow.check_drained()
    shadow.assert_clean()
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...kv_backends.block_ops import COPY, SWAP_IN, SWAP_OUT
from .kv_leaks import kv_leaks

MAX_ERRORS = 20
"""Errors kept: the first wrong read usually explains the ones after it."""


class KVShadow:
    """An executor that keeps a shadow of every KV slot and checks every read of a step against it,
    then runs the plan on `inner` (default: the simulated executor with the `steps` cost model).

    - `errors`: what went wrong, in order (at most `MAX_ERRORS`).
    - `reads`: how many slot reads it checked; `reads_by_seq`: per sequence id.
    - `device`, `host`: block -> list of `block_size` slot contents (None: never written).
    """

    def __init__(self, inner: Any = None, *, check_pool: bool = True) -> None:
        if inner is None:
            from ...executors.cost_models import make_cost_model
            from ...executors.simulated import SimulatedExecutor

            inner = SimulatedExecutor(make_cost_model("steps"))
        self.inner = inner
        self.check_pool = check_pool
        self.engine: Any = None
        self.device: dict[int, list] = {}
        self.host: dict[int, list] = {}
        self.errors: list[str] = []
        self.reads = 0
        self.reads_by_seq: Counter = Counter()
        self._trie: dict[tuple, int] = {}  # (parent node, token) or ("root", salt) -> node
        self._origin: list[tuple[str, int]] = [("", -1)]  # node -> (first sequence id, position)
        self._keys: dict[Any, list[int]] = {}  # sequence -> its prefix nodes, position by position
        self._drafted: list[tuple[Any, int, int, int]] = []  # (seq, position, block, j) of last step's drafts
        self._accepted: dict | None = None  # the last step's `StepResult.accepted` (the simulator's)

    # --- an executor ------------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def attach(self, engine: Any) -> Any:
        """Check `engine`'s pool and swap space too (before each step, and in `check_drained`);
        returns the engine."""
        self.engine = engine
        return engine

    def execute(self, plan: Any) -> Any:
        """Check the plan against the shadow (see the module docstring), then run it on `inner`."""
        if self.engine is not None and self.check_pool:
            self._check_engine(plan.step)
        bs = plan.block_size
        self._resolve_drafts(bs)
        swapped_out = self._run_block_ops(plan, bs)
        if swapped_out and self.engine is not None:
            self._check_host_copies(plan.step, swapped_out, bs)
        self._write(plan, bs)
        self._read(plan, bs)
        result = self.inner.execute(plan)
        self._accepted = getattr(result, "accepted", None)
        return result

    # --- the model --------------------------------------------------------------------------------

    def keys(self, seq: Any) -> list[int]:
        """`seq`'s prefix nodes: `keys(seq)[p]` stands for its tokens `0..p` after its salt (equal
        for any two sequences with the same salt and tokens up to `p`, and only for them)."""
        keys = self._keys.get(seq)
        if keys is None:
            keys = self._keys[seq] = []
        ids = seq.token_ids
        if len(keys) < len(ids):
            trie, origin = self._trie, self._origin
            parent = keys[-1] if keys else self._node(("root", seq.cache_salt), seq.seq_id, -1)
            for p in range(len(keys), len(ids)):
                key = (parent, ids[p])
                node = trie.get(key)
                if node is None:
                    node = trie[key] = len(origin)
                    origin.append((seq.seq_id, p))
                keys.append(node)
                parent = node
        return keys

    def _node(self, key: tuple, seq_id: str, position: int) -> int:
        node = self._trie.get(key)
        if node is None:
            node = self._trie[key] = len(self._origin)
            self._origin.append((seq_id, position))
        return node

    def describe_slot(self, held: Any) -> str:
        """What a slot holds, in words."""
        if held is None:
            return "nothing (never written)"
        if isinstance(held, tuple):
            return f"a draft of {held[1]} at position {held[2]}"
        seq_id, p = self._origin[held]
        return f"the KV of {seq_id}'s prefix at position {p}"

    def _fail(self, message: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)

    def _resolve_drafts(self, bs: int) -> None:
        # Verification appended the accepted drafts and one more token, so draft position p was
        # accepted iff p < len(token_ids) - 1 (and the simulator's acceptance covered its draft
        # j). Resolved on the memory the last step left, before this step's block ops (since then
        # the sequence may have been swapped or preempted).
        device, accepted = self.device, self._accepted
        for seq, p, block, j in self._drafted:
            if accepted is not None and accepted.get(seq, 0) < j:
                continue
            slots = device.get(block)
            if slots is not None and p < len(seq.token_ids) - 1 and slots[p % bs] == ("draft", seq.seq_id, p):
                slots[p % bs] = self.keys(seq)[p]
        self._drafted = []

    def _run_block_ops(self, plan: Any, bs: int) -> list[int]:
        device, host = self.device, self.host
        swapped_out = []
        for kind, src, dst in plan.block_ops:
            if kind == COPY:
                device[dst] = list(device.get(src) or [None] * bs)
            elif kind == SWAP_OUT:
                host[dst] = list(device.get(src) or [None] * bs)
                swapped_out.append(dst)
            elif kind == SWAP_IN:
                slots = host.pop(src, None)
                if slots is None:
                    self._fail(f"step {plan.step}: swap-in of host block {src}, which no swap-out filled")
                    slots = [None] * bs
                device[dst] = slots
            else:
                self._fail(f"step {plan.step}: unknown block op {kind!r}")
        return swapped_out

    def _check_host_copies(self, step: int, swapped_out: list[int], bs: int) -> None:
        """The host copy of each sequence swapped out in this step holds its computed prefix."""
        written = set(swapped_out)
        for seq in self.engine.scheduler.swapped:
            table = seq.host_table
            if written.isdisjoint(table):
                continue
            keys = self.keys(seq)
            computed = seq.num_computed_tokens
            for i, h in enumerate(table):
                if h not in written:
                    continue
                m = min(bs, computed - i * bs)
                if m > 0:
                    held = self.host[h]
                    want = keys[i * bs : i * bs + m]
                    if held[:m] != want:
                        o = next(j for j in range(m) if held[j] != want[j])
                        self._fail(
                            f"step {step}: {seq.seq_id} swapped out with wrong KV at position {i * bs + o} "
                            f"(host block {h}, slot {o}): it holds {self.describe_slot(held[o])}"
                        )

    def _write(self, plan: Any, bs: int) -> None:
        device = self.device
        for seq, n in plan.scheduled.items():
            table, keys = seq.block_table, self.keys(seq)
            known = len(keys)
            start = seq.num_computed_tokens
            for p in range(start, start + n):
                block = table[p // bs]
                slots = device.get(block)
                if slots is None:
                    slots = device[block] = [None] * bs
                if p < known:
                    slots[p % bs] = keys[p]
                else:  # a draft token's slot: its token is known once the step verified it
                    slots[p % bs] = ("draft", seq.seq_id, p)
                    self._drafted.append((seq, p, block, p - start))

    def _read(self, plan: Any, bs: int) -> None:
        device = self.device
        for seq, n in plan.scheduled.items():
            table, keys = seq.block_table, self.keys(seq)
            end = min(seq.num_computed_tokens + n, len(keys))
            self.reads += end
            self.reads_by_seq[seq.seq_id] += end
            for i in range(-(-end // bs)):
                m = min(bs, end - i * bs)
                slots = device.get(table[i])
                want = keys[i * bs : i * bs + m]
                if slots is None or slots[:m] != want:
                    o = 0 if slots is None else next(j for j in range(m) if slots[j] != want[j])
                    held = None if slots is None else slots[o]
                    self._fail(
                        f"step {plan.step}: {seq.seq_id} reads wrong KV at position {i * bs + o} "
                        f"(block {table[i]}, slot {o}): it holds {self.describe_slot(held)}"
                    )
                    break

    # --- the engine's pool and swap space ---------------------------------------------------------

    def _live(self) -> list[Any]:
        s = self.engine.scheduler
        return [*s.running, *s.waiting, *s.swapped]

    def _check_engine(self, step: int) -> None:
        live = self._live()
        try:
            self.engine.pool.check_invariants([q.block_table for q in live if q.block_table])
        except AssertionError as exc:
            self._fail(f"step {step}: KV pool invariant: {exc}")
        swap = self.engine.scheduler.swap
        if swap is not None:
            used = swap.num_blocks - swap.num_free_blocks()
            held = sum(len(q.host_table) for q in live)
            if used != held:
                self._fail(f"step {step}: {used} host blocks allocated, {held} held by swapped sequences")

    def check_drained(self) -> list[str]:
        """After every request ended (finished, cancelled, failed or refused): no device block is
        referenced (every one free or cached), every host block is free, the pool's invariants
        hold. Records what it finds in `errors` and returns them."""
        engine = self.engine
        if engine is None:
            raise RuntimeError("check_drained needs an engine: call attach(engine) first")
        if engine.has_unfinished():
            self._fail("check_drained: requests are still unfinished")
        for leak in kv_leaks(engine):
            self._fail(f"after the run: {leak}")
        return self.errors

    def assert_clean(self) -> None:
        """Raise `AssertionError` with the first error, if any."""
        if self.errors:
            more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
            raise AssertionError(self.errors[0] + more)
