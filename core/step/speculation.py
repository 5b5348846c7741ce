"""Speculative decoding as a scheduling decision: drafts in the plan, their verification, the roll-back.

With a `speculative_config`, the `num_draft_tokens` hook says, once a step, how many draft tokens
each running decode carries (0: none). `Speculation` then works in three places of the step:

1. `decide` (after `split_budget`): asks the hook; the drafts' tokens move from the prefill share
   to the decode share, as far as it goes (a decode's `1 + k` tokens are served before prefills;
   under `EngineConfig.budget_mode = "one"` there is one budget and nothing moves).
2. `serve` (a decode served by the scheduler): `k` is cut to the decode share left (under one
   budget: to what the requests served before it left), to the request's `max_new_tokens` and
   to `max_model_len`; the decode's KV slots cover its `1 + k`
   positions and the lookahead. Drafts never preempt: when the free blocks cannot hold them the
   decode runs without drafts. Only the blocks its newest token fills enter the prefix index.
3. after the forward, `verify` (from `Engine._sample`, once the newest token's row is sampled):
   while a sequence's last sampled token equals its next draft, the draft is accepted and the row
   after it is sampled; the first token that differs (or the one after the last draft, the bonus)
   ends its run. Each token goes through the `sample` hook and the stop checks as a plain decode's
   would, so a stop string, EOS or `max_tokens` cuts the run where it is met, and with seeded or
   greedy sampling the tokens are those of the run without speculation. Sampling the target at
   each position and comparing with a draft that was picked deterministically (n-gram lookup, a
   greedy draft model) is exact speculative sampling: a draft `d` is accepted with probability
   `p(d)`, and otherwise the token is drawn from `p` without `d`, renormalised. The simulator
   says how many drafts it accepts instead (`StepResult.accepted`).
4. `settle`: each drafting sequence's `num_computed_tokens` goes back to its verified tokens (the
   rejected positions are rolled back), the blocks that hold only rejected or lookahead slots are
   freed (vLLM keeps them with the request), and the blocks its accepted tokens filled enter the
   prefix index.

`EngineConfig.speculative_scheduling = "vllm"` (the vllm preset) follows vLLM 0.33's scheduler
where it differs: drafts preempt, are not cut at `max_tokens`, keep their blocks; a decode's
`1 + k` tokens are cut by the step's chunk cap (`max_prefill_chunk`, vLLM's
`long_prefill_token_threshold`, caps any request's tokens there); a request preempted since it
last sampled gets no drafts (vLLM drops a victim's drafts and drafts again only after a step that
sampled, so the last token of a recompute goes alone); a request admitted one token short of
decoding is padded with drafts never accepted (`padding`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..requests.sequence import RUNNING, Sequence

if TYPE_CHECKING:
    from ..plugins.manager import PluginManager
    from ..speculative_config import SpeculativeConfig
    from .plan import StepPlan, StepResult
    from .step_state import StepState


class SpecCounters:
    """What speculation did over a run, named as vLLM's metrics: `num_drafts` (request-steps that
    carried drafts), `num_draft_tokens` (drafts verified), `num_accepted_tokens`, and
    `accepted_per_pos[i]` (drafts accepted at position `i + 1` of a run); and `num_decode_steps`
    (decode request-steps, with drafts or not) and `num_extra_tokens` (tokens that verification
    added past each decode's first), for the tokens a decode gains per step."""

    __slots__ = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos", "num_decode_steps",
                 "num_extra_tokens")

    def __init__(self, max_drafts: int) -> None:
        self.num_decode_steps = 0
        self.num_extra_tokens = 0
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * max_drafts

    def as_dict(self) -> dict[str, Any]:
        drafted, accepted, drafts = self.num_draft_tokens, self.num_accepted_tokens, self.num_drafts
        return {
            "num_drafts": drafts, "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "accepted_per_pos": list(self.accepted_per_pos),
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "draft_tokens_thrown_away": drafted - accepted,
            "tokens_per_request_step": (1 + self.num_extra_tokens / self.num_decode_steps
                                        if self.num_decode_steps else None),
        }


class Speculation:
    """The scheduler's part of speculative decoding (see the module docstring)."""

    __slots__ = ("config", "plugins", "max_drafts", "max_model_len", "lookahead", "drafts", "counters", "vllm", "padded")

    def __init__(self, config: SpeculativeConfig, plugins: PluginManager, max_model_len: int, vllm: bool = False) -> None:
        self.config = config
        self.vllm = vllm  # EngineConfig.speculative_scheduling == "vllm"
        self.plugins = plugins
        self.max_drafts = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.lookahead = config.lookahead
        self.drafts: dict[Sequence, int] = {}
        self.counters = SpecCounters(self.max_drafts)
        self.padded: set[Sequence] = set()  # this step's padded admissions (`padding`)

    # --- scheduling --------------------------------------------------------------------------

    def decide(self, scheduler: Any, step: StepState) -> None:
        """Ask `num_draft_tokens` for this step's drafts; move their tokens to the decode share
        (split budget). Under vLLM's rules a decode that has not sampled since it was preempted
        is not offered drafts (`sampled_since_preempted`)."""
        if self.vllm:
            decodes = [s for s in scheduler.running if s.is_decoding and sampled_since_preempted(s)]
        else:
            decodes = [s for s in scheduler.running if s.is_decoding]
        self.drafts = drafts = {}
        if not decodes:
            return
        answer = self.plugins.hook.num_draft_tokens(ctx=scheduler.ctx, decodes=decodes, max_drafts=self.max_drafts)
        if answer is None:
            return
        if not isinstance(answer, (list, tuple)) or len(answer) != len(decodes):
            raise self.plugins.invalid(
                "num_draft_tokens", f"expected a list of {len(decodes)} draft counts (one per decode), got {answer!r:.80}"
            )
        top = self.max_drafts
        for seq, k in zip(decodes, answer):
            if type(k) is not int or not 0 <= k <= top:
                raise self.plugins.invalid(
                    "num_draft_tokens", f"{seq.seq_id}: {k!r} draft tokens is not an int in [0, {top}]"
                )
            if k:
                drafts[seq] = k
        if step.one_budget:
            return
        moved = min(sum(drafts.values()), step.prefill_left)
        step.decode_left += moved
        step.prefill_left -= moved

    def serve(self, seq: Sequence, pool: Any, room: Any, step: StepState) -> None:
        """Serve the decode `seq` with its drafts, if `pool` has room for them; else as a plain
        decode (with blocks from victims through `room` when needed): drafts never preempt. Under
        vLLM's rules (`EngineConfig.speculative_scheduling`) the drafts are not cut at
        `max_tokens`, they are cut by the step's chunk cap (with the decode's own token), and their
        slots come from victims too, as any decode's."""
        token_ids = seq.token_ids
        k = min(self.drafts.get(seq, 0), step.decode_left - 1, self.max_model_len - len(token_ids) - 1)
        if not self.vllm:
            k = min(k, seq.sampling.max_new_tokens - (len(token_ids) - seq.num_prompt_tokens) - 1)
        elif k > 0:  # vLLM's Scheduler.schedule: allocate_slots(1 + k, lookahead), preempting on failure
            # but never more slots than the whole pool holds: preempting itself for them would
            # repeat at every step (vLLM's pool always holds a max_model_len context; ours may not)
            k = min(k, step.max_chunk - 1,
                    pool.num_blocks * pool.block_size - seq.num_computed_tokens - 1 - self.lookahead)
        if self.vllm and k > 0:
            if room.grow(seq, 1 + k + self.lookahead, step):
                step.schedule(seq, 1 + k, True, k)
            return
        computed, ops = seq.num_computed_tokens, step.plan.block_ops
        if k <= 0 or not pool.allocate_slots(seq.block_table, computed, 1 + k + self.lookahead, ops):
            if not (pool.allocate_slots(seq.block_table, computed, 1, ops) or room.grow(seq, 1, step)):
                return
            k = 0
        step.schedule(seq, 1 + k, True, k)

    def padding(self, seq: Sequence, step: StepState) -> int:
        """Under vLLM's rules, the padding drafts of `seq`, a waiting request admitted one token
        short of decoding (a prefix hit of all its tokens but the last): vLLM's waiting loop
        (`Scheduler.schedule`, "Pad new decode requests to uniform spec decoding size") gives it
        `1 + num_speculative_tokens` tokens, the drafts never accepted, when no running request's
        prefill chunk is in the step, a running request is or its hit is not empty, and
        `max_model_len` has room; -1 when the step's budget has not the room (admission stops
        there, as vLLM's loop breaks), unless nothing else runs in the step (where vLLM would
        stall, it is admitted unpadded); 0: no padding. Scans the step's plan: only on this path."""
        k = self.max_drafts
        if not self.vllm or seq.num_computed_tokens + k + 2 > self.max_model_len:
            return 0
        plan = step.plan
        admitted, decodes = plan.admitted, plan.decodes
        running = [s for s in plan.scheduled if s not in admitted]
        if any(s not in decodes for s in running) or not (running or seq.num_computed_tokens):
            return 0
        if 1 + k <= step.tokens_left():
            return k
        return -1 if running else 0  # alone in the step it runs unpadded: vLLM would stall there

    def schedule_padded(self, seq: Sequence, pad: int, step: StepState) -> None:
        """Schedule the padded admission `seq` (`padding`): `1 + pad` tokens of the decode share
        (moved there from the prefill share as needed), its drafts rejected in `verify`."""
        moved = max(0, 1 + pad - step.decode_left)
        step.decode_left += moved
        step.prefill_left -= moved
        step.schedule(seq, 1 + pad, True, pad)
        self.padded.add(seq)

    # --- after the forward -------------------------------------------------------------------

    def after_step(self, plan: StepPlan, result: StepResult, draw: Any, pool: Any, caching: bool) -> list[Sequence]:
        """Verify the step's drafts and settle (see `verify`, `settle`); count its decodes.
        Returns the sequences that got tokens in verification."""
        self.counters.num_decode_steps += len(plan.decodes)
        padded, self.padded = self.padded, set()
        if not plan.drafts:
            return []
        more = self.verify(plan, result, draw, padded)
        self.counters.num_extra_tokens += len(more)
        self.settle(plan, pool, caching)
        return more

    def verify(self, plan: StepPlan, result: StepResult, draw: Any, padded: Any = ()) -> list[Sequence]:
        """Accept drafts, position by position: `draw(seqs, logits)` samples one row per sequence,
        appends the tokens and checks stops (what `Engine._sample` does for a step's first row),
        returning the sequences that got their token; the `padded` ones accept none. Returns every
        sequence that got a token here."""
        drafts, proposed, sim_accepted = plan.drafts, result.draft_tokens, result.accepted
        rows, offsets = result.draft_logits, {}
        if proposed is not None:
            at = 0
            for seq in drafts:
                offsets[seq] = at
                at += len(proposed.get(seq, ()))
        elif sim_accepted is None:
            sim_accepted = {}
        accepted = dict.fromkeys(drafts, 0)
        got: list[Sequence] = []
        live = [s for s in drafts if s not in padded] if padded else list(drafts)
        j = 0
        while live:
            j += 1  # the last token sampled verified draft j
            if proposed is None:
                live = [s for s in live if s.state is RUNNING and sim_accepted.get(s, 0) >= j and drafts[s] >= j]
            else:
                live = [s for s in live if s.state is RUNNING and _matches(s, proposed.get(s, ()), j)]
            if not live:
                break
            for seq in live:
                accepted[seq] = j
            logits = None if rows is None else pick_rows(rows, [offsets[s] + j - 1 for s in live])
            live = draw(live, logits)
            got += live
        self._count(drafts, proposed, accepted)
        return got

    def _count(self, drafts: dict[Sequence, int], proposed: Any, accepted: dict[Sequence, int]) -> None:
        c = self.counters
        per_pos = c.accepted_per_pos
        for seq, k in drafts.items():
            if proposed is not None:
                k = len(proposed.get(seq, ()))
                if not k:
                    continue
            a = accepted[seq]
            c.num_drafts += 1
            c.num_draft_tokens += k
            c.num_accepted_tokens += a
            seq.num_draft_tokens += k
            seq.num_accepted_tokens += a
            if a < k and seq.state is RUNNING:  # a rejected draft ended the run (not a stop)
                seq.num_draft_rejections += 1
            for i in range(a):
                per_pos[i] += 1

    def settle(self, plan: StepPlan, pool: Any, caching: bool) -> None:
        """Roll each drafting sequence back to its verified tokens: `num_computed_tokens`, the
        blocks holding only rejected (or lookahead) slots freed; index the blocks its accepted
        tokens filled."""
        bs = plan.block_size
        for seq in plan.drafts:
            token_ids, table = seq.token_ids, seq.block_table
            if not table:
                continue  # failed: its blocks are gone
            verified = len(token_ids) - 1
            if seq.num_computed_tokens > verified:
                seq.num_computed_tokens = verified
            keep = -(-verified // bs)
            if len(table) > keep and not self.vllm:  # vLLM keeps them until the request ends
                pool.release(table[keep:])
                del table[keep:]
            full = verified // bs
            if caching and full > seq.num_cached_blocks:
                pool.cache_full_blocks(table, token_ids, seq.num_cached_blocks, full, seq.cache_salt)
                seq.num_cached_blocks = full


def sampled_since_preempted(seq: Sequence) -> bool:
    """Whether the decode `seq` sampled a token since it was last preempted: its computed tokens
    passed the most it had computed before (`max_computed`, kept at each preemption). A request
    resumed by recompute reaches its last known token without sampling it."""
    return seq.num_computed_tokens > seq.max_computed


def _matches(seq: Sequence, proposed: Any, j: int) -> bool:
    """Whether `seq`'s last sampled token equals its draft `j` (1-based)."""
    return j <= len(proposed) and seq.token_ids[-1] == proposed[j - 1]


def pick_rows(logits: Any, rows: list[int]) -> Any:
    """The rows `rows` of `logits` (a list of rows, or a tensor or array indexed once)."""
    if isinstance(logits, (list, tuple)):
        return [logits[i] for i in rows]
    return logits[rows]
