"""`AsyncEngine` without HTTP: a reader that stops reading is cancelled; the cold-start ramp."""

from __future__ import annotations

import asyncio

import pytest

from metroline.core.async_engine import AsyncEngine, Rejected
from metroline.core.config import EngineConfig
from metroline.core.engine import Engine
from metroline.core.request import Request, SamplingParams
from metroline.core.sequence import FinishReason
from metroline.executors.cost_models import make_cost_model
from metroline.executors.realtime import RealtimeExecutor
from metroline.executors.simulated import SimulatedExecutor


def engine(**config) -> Engine:
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=0.001)))
    return Engine(EngineConfig(**config), executor, retain_finished=False)


def request(rid: str, tokens: int) -> Request:
    return Request(request_id=rid, prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_new_tokens=tokens))


def test_a_stream_nobody_reads_is_cancelled_after_the_stall_timeout_and_its_blocks_freed():
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
    assert 4 < len(stalled.tokens) < 30_000
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
