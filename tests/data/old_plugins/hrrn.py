"""Highest response ratio next: admit the waiting request whose (waited + service) / service is
highest. A short request goes first; a long one's ratio grows as it waits."""

import heapq

from metroline.core.plugins.candidates import Candidates
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.victims import last_admitted_victim


class HRRN:
    name = "hrrn"

    def __init__(self, prefill_weight=0.1, default_output_tokens=128, step_time=0.01):
        self.prefill_weight = prefill_weight  # a prompt token costs this much of an output token
        self.default_output_tokens = default_output_tokens  # when nothing estimates a length
        self.step_time = step_time  # seconds per output token: waiting and service in one unit
        self.service = {}  # sequence -> its expected service, in seconds

    def expected_service(self, ctx, seq):
        s = self.service.get(seq)
        if s is None:
            out = seq.expected_output_tokens  # the request's hint (--oracle-lengths sets it)
            if out is None:
                out = ctx.hooks.estimate_output_tokens(ctx=ctx, seq=seq)  # any estimator plugin
            if out is None:
                out = self.default_output_tokens
            s = self.service[seq] = self.step_time * (self.prefill_weight * seq.num_prompt_tokens + out + 1)
        return s

    @hookimpl
    def admission(self, ctx):
        now = ctx.now
        # a copy of the queues, made now: the scheduler admits while it pulls from the answer,
        # and a loop over ctx.waiting across those pulls would fail
        heap = []
        for seq in [*ctx.swapped, *ctx.waiting]:
            s = self.expected_service(ctx, seq)
            heap.append((-(now - seq.arrival_time + s) / s, seq.arrival_no, seq.index, seq))
        heapq.heapify(heap)  # O(queue); then O(log queue) per candidate pulled
        return Candidates((heapq.heappop(heap)[-1] for _ in range(len(heap))), head_of_line=True)

    @hookimpl
    def select_victim(self, ctx, requester):
        return last_admitted_victim(ctx, requester)

    @hookimpl
    def on_finished(self, seqs):
        for seq in seqs:
            self.service.pop(seq, None)
