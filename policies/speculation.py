"""`adaptive_speculation`: per request and step, the drafts that pay for what they cost.

Speculation trades compute for steps. Draft `j` of a run is accepted (with the ones before it)
with probability about `a ** j`, `a` the request's per-draft acceptance, so `k` drafts give
`E = 1 + a + ... + a ** k = (1 - a ** (k + 1)) / (1 - a)` tokens in expectation; each costs the
target one more token of work (and a draft model one more forward per draft position). At batch 1
a decode step is bound by reading the weights and drafts ride along almost free; as the batch
grows, or a prefill chunk shares the step, it becomes bound by compute, a draft costs a token's
compute, and a rejected one is work that delays every request in the batch. So, once a step,
with `speculative_config` set (it stacks on any policy):

- each decode's acceptance so far: `a = (accepted + prior * prior_rate) / (accepted + rejections
  + prior)` (`seq.num_accepted_tokens`, `seq.num_draft_rejections`: the maximum-likelihood rate of
  its runs, which stop at the first rejection; `prior` pseudo-drafts at `prior_rate` for a new
  request);
- the step's seconds with `k` drafts per decode, `k = 0 .. max_drafts`, from the cost model
  (`cost_model`, `cost_params`: the simulator's default, `roofline`, unless told): the decodes'
  own step, plus the most the drafts add either to it alone or to the step with the prefill
  chunks it would carry (running prefills, then waiting prompts while the batch has seats, in
  the rest of `max_num_batched_tokens`): the marginal cost of a token at this batch size, never
  taken as free because a prefill fills the budget (a draft there displaces prefill work the
  batch then waits through), and dearer when that prefill makes the step compute-bound. Between
  the `k` the cost is interpolated; a draft model adds `draft_cost` x the decodes' step per
  draft position reached;
- the drafts that minimise the step's seconds per token over its decodes, `seconds x (sum of
  w_i x E_i ** -tail_power / sum of w_i) ** (1 / tail_power)`: `tail_power` 1 is the mean TPOT,
  larger weighs the slowest decodes (the low-acceptance ones, which gain little from drafts but
  wait for everyone else's) more, as a P99 TPOT does (`choose_drafts`: exact when there is no
  draft model). `w_i = (t_i / mean t) ** tail_weight`, `t_i` decode `i`'s seconds per output
  token so far (`seq.first_token_time` to the step, over its output tokens after the first, with
  `HISTORY_PRIOR_TOKENS` more at the step's seconds without drafts, so a new decode counts as
  that step): the requests that have been slowest so far, those a P99 TPOT is made of, get more of
  the drafts and weigh more against the time others' drafts add (`tail_weight` 0: every decode
  alike).

So a request whose drafts fail gets none, one whose drafts pass gets more, and every request
fewer as the batch (or the step's prefill) makes tokens dear. `by_batch_size`, a table of
`[batch size, most drafts]` rows (vLLM's draft count by batch size), caps the drafts further when
given: from that many running decodes on, each carries at most that many.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from metroline.api import PluginOptions, Sequence, StepPlan, hookimpl, make_cost_model, take_options

HISTORY_PRIOR_TOKENS = 2
"""Output tokens at the step's seconds (without drafts) added to each decode's own seconds per token
so far, for `tail_weight`: a decode's first steps do not swing its weight."""


class AdaptiveSpeculation:
    """`adaptive_speculation`: answers `num_draft_tokens` from the cost model and each request's
    measured acceptance (see the module docstring). Options: `AdaptiveSpeculation.Options`."""

    name = "adaptive_speculation"

    class Options(PluginOptions):
        """`[plugin_options.adaptive_speculation]`."""

        cost_model: str = Field(default="roofline", description="the cost model that prices a step (the run's own)")
        cost_params: dict[str, Any] = Field(default_factory=dict, description="its parameters")
        by_batch_size: list[list[int]] | None = Field(
            default=None,
            description="rows [batch size, most drafts], batch sizes increasing: from that many decodes on, "
            "at most that many drafts each (None: no cap beyond the cost model's)",
        )
        prior_rate: float = Field(default=0.7, gt=0, lt=1, allow_inf_nan=False,
                                  description="a new request's assumed acceptance rate")
        prior: float = Field(default=4.0, ge=0, allow_inf_nan=False,
                             description="how many draft tokens the prior weighs as")
        tail_power: float = Field(default=2.0, ge=1, le=64, allow_inf_nan=False,
                                  description="the power mean of the decodes' seconds per token that the drafts "
                                  "minimise: 1 the mean (mean TPOT), larger weighs the slowest decodes more (P99 TPOT)")
        tail_weight: float = Field(default=1.0, ge=0, le=8, allow_inf_nan=False,
                                   description="each decode weighs (its seconds per token so far / the batch's mean) to "
                                   "this power: larger gives the requests slowest so far more of the drafts; 0 weighs all alike")

        @field_validator("by_batch_size")
        @classmethod
        def _table(cls, rows: list[list[int]] | None) -> list[list[int]] | None:
            if rows is None:
                return None
            if not rows:
                raise ValueError("by_batch_size needs at least one row")
            last = 0
            for row in rows:
                if len(row) != 2 or row[0] < 1 or row[1] < 0:
                    raise ValueError(f"by_batch_size row {row}: expected [batch size >= 1, drafts >= 0]")
                if row[0] <= last:
                    raise ValueError(f"by_batch_size: batch sizes must increase, {row[0]} after {last}")
                last = row[0]
            return rows

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        try:
            self.cost = make_cost_model(self.options.cost_model, **self.options.cost_params)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"plugin_options.adaptive_speculation.cost_model: {exc}") from None

    def drafts_for_batch(self, batch: int, max_drafts: int) -> int:
        """The most drafts a decode carries in a batch of `batch` decodes (`by_batch_size`)."""
        most = max_drafts
        for size, drafts in self.options.by_batch_size or ():
            if batch < size:
                break
            most = drafts
        return min(most, max_drafts)

    def rate(self, seq: Sequence) -> float:
        """`seq`'s per-draft acceptance so far, with the prior (see the module docstring)."""
        o = self.options
        accepted = seq.num_accepted_tokens
        return (accepted + o.prior * o.prior_rate) / (accepted + seq.num_draft_rejections + o.prior)

    def step_costs(self, ctx: Any, decodes: list[Sequence], most: int) -> tuple[list[float], float]:
        """The step's seconds with every decode carrying `k` drafts, for `k = 0 .. most` (see the
        module docstring); and a draft model's forward over the decodes (0 for n-gram lookup)."""
        config, bs = ctx.config, ctx.block_size
        budget = config.max_num_batched_tokens
        prefills = pending_prefills(ctx, len(decodes))
        alone = [self.cost.step_time(step_plan(bs, decodes, k, [], budget)) for k in range(most + 1)]
        if prefills:
            step = [self.cost.step_time(step_plan(bs, decodes, k, prefills, budget)) for k in range(most + 1)]
            costs = [alone[0] + max(alone[k] - alone[0], step[k] - step[0]) for k in range(most + 1)]
        else:
            costs = alone
        spec = config.speculative_config
        ratio = spec.draft_cost_ratio if spec is not None else 0.0
        draft = ratio * alone[0]
        return costs, draft

    @hookimpl
    def num_draft_tokens(self, ctx: Any, decodes: list[Sequence], max_drafts: int) -> list[int]:
        most = self.drafts_for_batch(len(decodes), max_drafts)
        if most == 0:
            return [0] * len(decodes)
        costs, draft = self.step_costs(ctx, decodes, most)
        weights = self.weights(ctx.now, decodes, costs[0]) if self.options.tail_weight else None
        return choose_drafts([self.rate(s) for s in decodes], most, costs, draft, self.options.tail_power, weights)

    def weights(self, now: float, decodes: list[Sequence], step: float) -> list[float]:
        """Each decode's weight, `(t_i / mean t) ** tail_weight` (see the module docstring): `t_i`
        its seconds per output token so far, with `HISTORY_PRIOR_TOKENS` at `step` seconds."""
        times = []
        for seq in decodes:
            first = seq.first_token_time
            after = seq.num_output_tokens - 1
            spent = now - first if first is not None and after > 0 else 0.0
            times.append((spent + HISTORY_PRIOR_TOKENS * step) / (max(after, 0) + HISTORY_PRIOR_TOKENS))
        mean = sum(times) / len(times)
        q = self.options.tail_weight
        return [(t / mean) ** q for t in times] if mean > 0 else [1.0] * len(times)


def choose_drafts(rates: list[float], most: int, costs: list[float], draft: float, power: float,
                  weights: list[float] | None = None) -> list[int]:
    """Draft counts for decodes of acceptance `rates` (at most `most` each) that minimise the
    step's seconds per token over its decodes, `seconds x (sum(w_i x E_i ** -power)) ** (1 /
    power)`, `E_i` decode `i`'s expected tokens and `w_i` its weight (`weights`, 1 each when
    None): the best prefix of all drafts, each decode's next draft ordered by how much it cuts
    `w_i x E_i ** -power`. `costs[k]`: the step's seconds with `k` drafts per decode
    (interpolated between); `draft`: a draft forward's seconds, once per draft position reached."""
    b = len(rates)
    w = weights or [1.0] * b
    cuts = []
    for i, a in enumerate(rates):
        g = e = 1.0
        for j in range(1, most + 1):
            g *= a
            cuts.append((w[i] * (e ** -power - (e + g) ** -power), j, i))
            e += g
    cuts.sort(key=lambda t: -t[0])
    total, depth, root = float(sum(w)), 0, 1.0 / power
    best, best_n = costs[0] * total ** root, 0
    for n, (cut, j, _) in enumerate(cuts, 1):
        total -= cut
        depth = max(depth, j)
        whole, part = divmod(n, b)
        seconds = costs[whole] + (costs[whole + 1] - costs[whole]) * part / b if part else costs[whole]
        value = (seconds + draft * depth) * max(total, 0.0) ** root
        if value < best:
            best, best_n = value, n
    counts = [0] * b
    for _, _, i in cuts[:best_n]:
        counts[i] += 1
    return counts


def pending_prefills(ctx: Any, num_decodes: int) -> list[tuple[Sequence, int]]:
    """The prefill chunks the step would carry besides its decodes: running prefills, then
    waiting prompts while the batch has room, within `max_num_batched_tokens`."""
    config = ctx.config
    room = config.max_num_batched_tokens - num_decodes
    chunk = config.prefill_chunk
    found: list[tuple[Sequence, int]] = []
    seats = config.max_num_seqs - len(ctx.running)
    for source, admit in ((ctx.running, False), (ctx.waiting, True)):
        for seq in source:
            if room <= 0 or (admit and seats <= 0):
                return found
            left = len(seq.token_ids) - seq.num_computed_tokens
            if seq.is_decoding or left <= 0:
                continue
            n = min(left, chunk, room)
            found.append((seq, n))
            room -= n
            seats -= admit
    return found


def step_plan(block_size: int, decodes: list[Sequence], k: int, prefills: list[tuple[Sequence, int]],
              budget: int) -> StepPlan:
    """A plan for pricing only: `decodes` with `k` drafts each, and the `prefills` chunks in the
    rest of the `budget` (drafts take their tokens from the prefills' share, as the core does)."""
    plan = StepPlan(0, block_size)
    scheduled = plan.scheduled
    context = 0
    for seq in decodes:
        scheduled[seq] = 1 + k
        context += seq.num_computed_tokens + 1 + k
    plan.num_decode_tokens = len(decodes) * (1 + k)
    plan.num_draft_tokens = len(decodes) * k
    room = budget - plan.num_decode_tokens
    for seq, n in prefills:
        n = min(n, room)
        if n <= 0:
            break
        scheduled[seq] = n
        context += seq.num_computed_tokens + n
        plan.num_prefill_tokens += n
        room -= n
    plan.num_context_tokens = context
    return plan
