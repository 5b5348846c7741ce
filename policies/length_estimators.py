"""Output-length estimators: plugins that answer `estimate_output_tokens` under any policy.

A policy that orders requests by their expected length (`srpt`, a shortest-job or HRRN policy of
your own) asks `ctx.hook.estimate_output_tokens(ctx=ctx, seq=seq)` when a request carries no
`expected_output_tokens` hint. Stack one of these to answer it, under any base policy:

    metroline run --policy srpt --plugin length_regression
    metroline run --policy mypkg.hrrn:HRRN --plugin length_mean

- `length_mean` (`LengthMean`): the rounded mean output length of the tenant's completed requests.
- `length_regression` (`LengthRegression`): a least-squares line `output = a + b x prompt tokens`
  per tenant, fitted online to the tenant's completed requests; the tenant's mean until it has
  `min_samples` of them with at least two different prompt lengths.

Both learn only what a deployment sees: the prompt and output lengths of the requests that
completed (finish reason EOS, length or stop), in `on_finished`; never a cancelled, failed or
still running request, nor the workload's true lengths. Until a tenant has a completed request
the estimate is `prior_output_tokens`. An estimate above the request's `max_new_tokens` is left
as it is: the policy caps it (`Sequence.remaining_output_tokens` does).

Stacked estimators answer newest first (the first answer wins, as for every decision hook).
`srpt` keeps a private `LengthMean` of its own (with its `prior_output_tokens`) and uses it when
no plugin answers, so `srpt` alone orders exactly as `srpt` with `--plugin length_mean`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from pydantic import Field

from metroline.api import FinishReason, PluginOptions, Sequence, hookimpl, take_options

COMPLETED = frozenset((FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP))
"""The finish reasons whose output length an estimator learns from (the request ran to its end)."""


PRIOR_FIELD = Field(default=128, ge=0, description="the estimate for a tenant with no completed request yet")


def rounded_mean(total: int, count: int) -> int:
    """The mean `total / count` rounded to the nearest int (halves to even, as `round` does)."""
    return round(total / count)


class LengthMean:
    """Estimates a request's output length as the mean of its tenant's completed requests.

    Answers **estimate_output_tokens** with `round(sum / count)` of the output lengths of the
    tenant's completed requests (EOS, length or stop; cancelled and failed ones are left out),
    `prior_output_tokens` while the tenant has none.

    Options (`[plugin_options.length_mean]`):

    - `prior_output_tokens` (int >= 0, default 128): the estimate for a tenant with no completed
      request yet.
    """

    name = "length_mean"

    class Options(PluginOptions):
        """`[plugin_options.length_mean]`."""

        prior_output_tokens: int = PRIOR_FIELD

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self.prior_output_tokens = self.options.prior_output_tokens
        self.tenant_stats: dict[str, list[int]] = {}  # tenant -> [sum of output tokens, count]

    @hookimpl
    def estimate_output_tokens(self, seq: Sequence) -> int:
        stats = self.tenant_stats.get(seq.tenant)
        if not stats:
            return self.prior_output_tokens
        return rounded_mean(stats[0], stats[1])

    @hookimpl
    def on_finished(self, seqs: list[Sequence]) -> None:
        stats = self.tenant_stats
        for s in seqs:
            if s.finish_reason in COMPLETED:
                st = stats.get(s.tenant)
                if st is None:
                    stats[s.tenant] = [s.num_output_tokens, 1]
                else:
                    st[0] += s.num_output_tokens
                    st[1] += 1


class LengthRegression:
    """Estimates a request's output length from its prompt length, by a line fitted per tenant.

    For each tenant it keeps the sums `n, sum x, sum y, sum x^2, sum xy` over its completed
    requests (x: prompt tokens, y: output tokens) and answers **estimate_output_tokens** with the
    ordinary least-squares line at the request's prompt length,

        b = (n sum xy - sum x sum y) / (n sum x^2 - (sum x)^2),   a = (sum y - b sum x) / n,

    `round(a + b x)` (computed exactly, in fractions), at least 0. With fewer than `min_samples`
    completed requests, or when all of them had the same prompt length (no slope to fit), it
    answers the tenant's rounded mean output length, and `prior_output_tokens` while the tenant
    has none. The sums are ints, so the fit costs O(1) per request and never drifts.

    Options (`[plugin_options.length_regression]`):

    - `prior_output_tokens` (int >= 0, default 128): the estimate for a tenant with no completed
      request yet.
    - `min_samples` (int >= 2, default 8): completed requests a tenant needs before its line is
      used instead of its mean.
    """

    name = "length_regression"

    class Options(PluginOptions):
        """`[plugin_options.length_regression]`."""

        prior_output_tokens: int = PRIOR_FIELD
        min_samples: int = Field(
            default=8, ge=2, description="completed requests a tenant needs before its line is used instead of its mean"
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self.prior_output_tokens, self.min_samples = self.options.prior_output_tokens, self.options.min_samples
        self.sums: dict[str, list[int]] = {}  # tenant -> [n, sum x, sum y, sum x^2, sum xy]

    def line(self, tenant: str) -> tuple[Fraction, Fraction] | None:
        """The tenant's fitted `(a, b)`, or None while the mean is used instead."""
        s = self.sums.get(tenant)
        if s is None or s[0] < self.min_samples:
            return None
        n, sx, sy, sxx, sxy = s
        spread = n * sxx - sx * sx
        if spread == 0:
            return None
        b = Fraction(n * sxy - sx * sy, spread)
        return (sy - b * sx) / n, b

    @hookimpl
    def estimate_output_tokens(self, seq: Sequence) -> int:
        fit = self.line(seq.tenant)
        if fit is None:
            s = self.sums.get(seq.tenant)
            return rounded_mean(s[2], s[0]) if s else self.prior_output_tokens
        a, b = fit
        return max(0, round(a + b * seq.num_prompt_tokens))

    @hookimpl
    def on_finished(self, seqs: list[Sequence]) -> None:
        sums = self.sums
        for seq in seqs:
            if seq.finish_reason not in COMPLETED:
                continue
            x, y = seq.num_prompt_tokens, seq.num_output_tokens
            s = sums.get(seq.tenant)
            if s is None:
                sums[seq.tenant] = [1, x, y, x * x, x * y]
            else:
                s[0] += 1
                s[1] += x
                s[2] += y
                s[3] += x * x
                s[4] += x * y
