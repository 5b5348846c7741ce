"""Plugins that fail for chosen requests, for the bridge's tests of failures scoped to their cause
(`metroline.tests.integration_vllm.faulty_plugins:Faulty` in the `metroline` section's `plugins`:
the module is found through the `metroline` package, in the test process and in a vLLM server).

A request chooses its failure by its `fail_in` field (`vllm_xargs` of an OpenAI request,
`SamplingParams.extra_args` of a vLLM request; the bridge hands it to plugins as `seq.metadata`)."""

from __future__ import annotations

from metroline.api import hookimpl

RAISED: list[tuple[str, list[str]]] = []
"""(hook, request ids) for each raise of `VictimRaises`: the running requests when it raised."""


def wants(seq, hook: str) -> bool:
    return seq.metadata.get("fail_in") == hook


class Faulty:
    """For a request whose `fail_in` names one of its hooks: `check_request` refuses it
    (`fail_in: "refuse"`) or raises (`"check_request"`), `on_arrival` raises (`"on_arrival"`),
    `estimate_output_tokens` raises (`"estimate_output_tokens"`). Everything else is untouched."""

    name = "faulty"

    @hookimpl
    def check_request(self, seq):
        if wants(seq, "refuse"):
            return "this request is refused by the test"
        if wants(seq, "check_request"):
            raise RuntimeError("check_request fails for this request")
        return None

    @hookimpl
    def on_arrival(self, seqs):
        for seq in seqs:
            if wants(seq, "on_arrival"):
                raise ValueError("on_arrival fails for this request")

    @hookimpl
    def estimate_output_tokens(self, seq):
        if wants(seq, "estimate_output_tokens"):
            raise ZeroDivisionError("no estimate for this request")
        return None


class AsksEstimates:
    """Admission in arrival order that asks `estimate_output_tokens` of each candidate as it
    yields it (lazily, as a policy ranking by estimates would): an estimate's error arises in the
    step's admission, attributed to its request."""

    name = "asks_estimates"

    @hookimpl
    def admission(self, ctx):
        def candidates():
            for seq in list(ctx.waiting):
                ctx.hook.estimate_output_tokens(ctx=ctx, seq=seq)
                yield seq

        return candidates()


class VictimRaises:
    """`select_victim` raises whenever it is asked (an error of no one request: the step's
    requests in doubt fail); each raise is recorded in `RAISED`."""

    name = "victim_raises"

    @hookimpl
    def select_victim(self, ctx, requester):
        RAISED.append(("select_victim", sorted(s.request_id for s in ctx.running)))
        raise RuntimeError("select_victim is broken")


class TokensRaise:
    """`on_tokens` raises once, at the first step whose sampled requests include one with
    `fail_in: "on_tokens"` that has two tokens or more (an observer's error of no one request: the
    step's sampled requests fail); the raise is recorded in `RAISED`."""

    name = "tokens_raise"

    def __init__(self) -> None:
        self.raised = False

    @hookimpl
    def on_tokens(self, seqs):
        if not self.raised and any(wants(s, "on_tokens") and s.num_output_tokens >= 2 for s in seqs):
            self.raised = True
            RAISED.append(("on_tokens", sorted(s.request_id for s in seqs)))
            raise RuntimeError("on_tokens is broken")


class AdmissionRaises:
    """Admission in arrival order that, once, at a step with requests running and two or more
    waiting, yields the first waiting request and raises when the next is pulled (vLLM has
    admitted the first by then): an error of no one request in the middle of vLLM's step; the
    raise is recorded in `RAISED` with the running requests then (the one admitted included)."""

    name = "admission_raises"

    def __init__(self) -> None:
        self.raised = False

    @hookimpl
    def admission(self, ctx):
        waiting = list(ctx.waiting)
        if self.raised or len(waiting) < 2 or not ctx.running:
            return waiting

        def candidates():
            yield waiting[0]
            self.raised = True
            RAISED.append(("admission", sorted(s.request_id for s in ctx.running)))
            raise RuntimeError("admission is broken")

        return candidates()
