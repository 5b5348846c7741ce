"""`AsyncEngine` without HTTP: a reader that stops reading is paused, then cancelled; one that
comes back is resumed where it stopped; the cold-start ramp; n > 1 samples."""

from __future__ import annotations

import asyncio

import pytest

from metroline.core.config import EngineConfig
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.request import Request, SamplingParams
from metroline.core.requests.sequence import FinishReason
from metroline.core.step.async_engine import AsyncEngine, Rejected
from metroline.core.step.engine import Engine
from metroline.executors.cost_models import make_cost_model
from metroline.executors.realtime import RealtimeExecutor
from metroline.executors.simulated import SimulatedExecutor


def engine(**config) -> Engine:
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    return Engine(EngineConfig(**config), executor, retain_finished=False)


def request(rid: str, tokens: int) -> Request:
    return Request(request_id=rid, prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_new_tokens=tokens))


def test_a_stream_nobody_reads_is_paused_at_its_buffer_then_cancelled_and_its_blocks_freed():
    eng = engine()

    async def main():
        loop = AsyncEngine(eng, buffer_tokens=4, stall_timeout=0.05)
        await loop.start()
        stalled = loop.submit(request("stalled", 30_000))
        read = loop.submit(request("read", 20))
        tokens = await read.result()
        for _ in range(1000):  # bounded: 10 s
            if stalled.finished:
                break
            await asyncio.sleep(0.01)
        await loop.shutdown()
        return stalled, tokens

    stalled, tokens = asyncio.run(main())
    assert len(tokens) == 20
    assert stalled.finish_reason is FinishReason.CANCELLED
    assert len(stalled.tokens) == 4  # paused once its buffer (4 tokens) was full: no token more
    eng.pool.check_invariants([])
    assert eng.pool.num_used_blocks() == 0 and not eng.has_unfinished()


def test_the_cold_start_ramp_admits_one_request_at_first():
    eng = engine(max_num_seqs=8)

    async def main():
        # 60 s ramp over 8 slots: one request in flight for the first 7.5 s
        loop = AsyncEngine(eng, ramp_s=60.0)
        await loop.start()
        first = loop.submit(request("first", 5))
        with pytest.raises(Rejected) as refused:
            loop.submit(request("second", 5))
        await first.result()
        after = loop.submit(request("third", 5))  # the first one ended: room again
        await after.result()
        await loop.shutdown()
        return refused.value

    refused = asyncio.run(main())
    assert (refused.status, refused.reason, refused.retry_after) == (429, "ramp", 1.0)
    assert "at most 1 requests in flight during the first 60.0 s" in str(refused)


def test_a_reader_that_comes_back_resumes_where_it_stopped_with_nothing_freed_or_recomputed():
    eng = engine()
    seen = {}

    async def main():
        loop = AsyncEngine(eng, buffer_tokens=5, stall_timeout=30.0)
        await loop.start()
        slow = loop.submit(request("slow", 40))
        other = loop.submit(request("other", 60))
        while len(slow.tokens) < 5:  # nobody reads "slow": its buffer fills
            await asyncio.sleep(0.002)
        await other.result()  # meanwhile the other request runs to its end
        await asyncio.sleep(0.05)  # only "slow" is left: a step that schedules nothing, then idle
        seen["idle"] = eng.last_plan_empty
        seq = eng.sequences("slow")[0]
        seen["paused"] = loop.is_paused("slow")
        seen["held"] = (len(slow.tokens), seq.state.name, len(seq.block_table) > 0, seq.num_preemptions)
        tokens = await slow.result()  # the reader is back: it catches up, the request resumes
        await loop.shutdown()
        return tokens, other.tokens, seq

    tokens, other, seq = asyncio.run(main())
    # held, not rescued by the core (the plugin asked to be woken up at the stall deadline)
    assert seen == {"idle": True, "paused": True, "held": (5, "RUNNING", True, 0)}
    assert len(tokens) == 40 and len(other) == 60
    assert tokens == alone([1, 2, 3], 40)  # the same tokens as without the pause
    assert seq.num_preemptions == 0 and seq.recomputed_tokens == 0  # nothing freed, nothing recomputed
    eng.pool.check_invariants([])
    assert eng.pool.num_used_blocks() == 0 and not eng.has_unfinished()


def test_n_samples_stream_as_choices_each_with_its_own_tokens():
    from metroline.core.serving.tokens import ContentTokens

    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    eng = Engine(EngineConfig(), executor, plugins=[ContentTokens()], retain_finished=False)

    async def main():
        loop = AsyncEngine(eng)
        await loop.start()
        stream = loop.submit(Request(request_id="n3", prompt_token_ids=[1, 2, 3],
                                     sampling=SamplingParams(max_new_tokens=7, n=3)))
        await stream.result()
        await loop.shutdown()
        return stream

    stream = asyncio.run(main())
    reference = Engine(EngineConfig(), SimulatedExecutor(make_cost_model("steps")), plugins=[ContentTokens()])
    expected = reference.generate([Request(request_id="n3", prompt_token_ids=[1, 2, 3],
                                           sampling=SamplingParams(max_new_tokens=7, n=3))])["n3"]
    assert [c.tokens for c in stream.choices] == [s.output_token_ids for s in sorted(expected, key=lambda s: s.index)]
    assert len({tuple(c.tokens) for c in stream.choices}) == 3  # the samples differ
    assert stream.finish_reason is FinishReason.LENGTH and stream.num_output_tokens == 21
    eng.pool.check_invariants([])
    assert eng.pool.num_used_blocks() == 0


def alone(prompt: list[int], max_tokens: int) -> list[int]:
    """The tokens the default stand-in sampler gives this request alone (virtual clock)."""
    ref = Engine(EngineConfig(), SimulatedExecutor(make_cost_model("steps")))
    out = ref.generate([Request(request_id="r", prompt_token_ids=prompt, sampling=SamplingParams(max_new_tokens=max_tokens))])
    return out["r"][0].output_token_ids


# --- one tenant's plugin errors fail that tenant's requests only --------------------------------


class Hostile:
    """A plugin that misbehaves for tenant A's requests only, in one of four ways (`mode`): its
    `on_arrival` raises, its `sample` wrapper answers a token id that is none (-7) in A's rows, its
    `estimate_output_tokens` answers nonsense (`"lots"`; srpt asks it), its `check_request` answers
    something that is no reason (42)."""

    name = "hostile"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    @hookimpl
    def on_arrival(self, seqs):
        if self.mode == "raise" and any(s.tenant == "A" for s in seqs):
            raise ValueError("tenant A is not welcome")

    @hookimpl(wrapper=True)
    def sample(self, seqs):
        tokens = yield
        if self.mode != "sample":
            return tokens
        return [-7 if s.tenant == "A" else t for s, t in zip(seqs, tokens)]

    @hookimpl
    def estimate_output_tokens(self, seq):
        return "lots" if self.mode == "estimate" and seq.tenant == "A" else None

    @hookimpl
    def check_request(self, seq):
        return 42 if self.mode == "check" and seq.tenant == "A" else None


MODES = {  # mode -> (the hook the error names, what it says)
    "raise": ("on_arrival", "raised ValueError: tenant A is not welcome"),
    "sample": ("sample", "token id -7 is outside"),
    "estimate": ("estimate_output_tokens", "expected an int >= 0, got 'lots'"),
    "check": ("check_request", "expected a reason (a non-empty string) or None, got 42"),
}
CASES = [(policy, mode) for mode in MODES
         for policy in (["srpt"] if mode == "estimate" else ["fcfs", "static", "priority", "srpt", "weighted_fair",
                                                              "token_rr"])]


def tenant_request(rid: str, tenant: str, tokens: int) -> Request:
    prompt = [1 + (hash(rid) % 997), 2, 3, 4, 5][: 2 + len(rid) % 4]
    return Request(request_id=rid, tenant=tenant, prompt_token_ids=prompt, sampling=SamplingParams(max_new_tokens=tokens))


@pytest.mark.parametrize("policy, mode", CASES, ids=[f"{p}-{m}" for p, m in CASES])
def test_a_plugin_failing_tenant_a_requests_fails_those_only_and_tenant_b_streams_complete(policy, mode):
    """B's 6 requests run, then A's 4 and B's 4 more are submitted together (they arrive in one
    step): every B request completes with the tokens it gets with no hostile plugin at all, every
    A request fails with an error naming the plugin, the hook and the request, and every block
    comes back."""
    from metroline.core.serving.tokens import ContentTokens

    def make(plugins):
        executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
        return Engine(EngineConfig(policy=policy, max_num_seqs=8, num_blocks=64, block_size=4), executor,
                      plugins=[ContentTokens(), *plugins], retain_finished=False)

    first_b = [tenant_request(f"b{i}", "B", 30) for i in range(6)]
    a = [tenant_request(f"a{i}", "A", 30) for i in range(4)]
    later_b = [tenant_request(f"b{i}", "B", 12) for i in range(6, 10)]

    async def serve(eng, early, together):
        loop = AsyncEngine(eng)
        await loop.start()
        streams = {r.request_id: loop.submit(r) for r in early}
        for _ in range(1000):  # bounded: every early request has its first token (10 s at most)
            if all(s.choices[0].tokens or s.finished for s in streams.values()):
                break
            await asyncio.sleep(0.01)
        streams.update({r.request_id: loop.submit(r) for r in together})  # one loop turn: one step
        await asyncio.wait_for(asyncio.gather(*(s.result() for s in streams.values())), 60)
        await loop.shutdown()
        return streams, loop

    hostile = make([Hostile(mode)])
    interleaved = [r for pair in zip(a, later_b) for r in pair]
    streams, loop = asyncio.run(serve(hostile, first_b, interleaved))
    reference, _ = asyncio.run(serve(make([]), first_b, later_b))

    for r in first_b + later_b:
        s = streams[r.request_id]
        assert (s.finish_reason, s.error) == (FinishReason.LENGTH, None), (r.request_id, s.error)
        assert s.choices[0].tokens == reference[r.request_id].choices[0].tokens
        assert len(s.choices[0].tokens) == r.sampling.max_new_tokens
    hook, problem = MODES[mode]
    for r in a:
        s = streams[r.request_id]
        assert s.finish_reason is FinishReason.FAILED, (r.request_id, s.finish_reason)
        named = s.error.split(", hook")[0]  # a wrapper's bad answer names the wrapper too
        assert named in ("PluginError: plugin 'hostile'", "PluginError: plugin 'content_tokens (through wrapper "
                         "hostile)'") and f"hook '{hook}'" in s.error, s.error
        assert f"request '{r.request_id}'" in s.error and problem in s.error, s.error
    assert loop.describe()["plugin_errors"] >= (1 if mode != "check" else 0)
    hostile.pool.check_invariants([])
    assert hostile.pool.num_used_blocks() == 0 and not hostile.has_unfinished()


class FailsTheStep:
    """A `split_budget` that raises on the step after every request arrived: a plugin error that is
    no one request's, so the engine fails the requests that step left in doubt."""

    name = "fails_the_step"

    def __init__(self, arrived: int) -> None:
        self.arrived = arrived

    @hookimpl
    def split_budget(self, ctx, budget):
        if len(ctx.running) + len(ctx.waiting) == self.arrived and ctx.running:
            raise RuntimeError("no split today")
        return None


@pytest.mark.parametrize("count, shown", [
    (1, "(failed 1 request: r0)"),
    (2, "(failed 2 requests: r0, r1)"),
    (5, "(failed 5 requests: r0, r1, r2, r3, r4)"),
    (6, "(failed 6 requests: r0, r1, r2, r3, r4 and 1 more)"),
])
def test_a_plugin_error_names_at_most_five_failed_requests_on_stderr(count, shown, capsys):
    eng = Engine(EngineConfig(max_num_seqs=8), RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001))),
                 plugins=[FailsTheStep(count)], retain_finished=False)

    async def main():
        loop = AsyncEngine(eng)
        await loop.start()
        streams = [loop.submit(request(f"r{i}", 5)) for i in range(count)]
        await asyncio.wait_for(asyncio.gather(*(s.result() for s in streams)), 60)
        await loop.shutdown()
        return streams

    streams = asyncio.run(main())
    assert all(s.finish_reason is FinishReason.FAILED for s in streams)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("metroline: ")]
    assert len(err) == 1 and err[0].endswith(shown), err
