"""The one driving loop: engines stepped in time order, arrivals delivered when their time comes,
idle clocks moved, steps without progress counted, stalls raised.

`Engine.stream` drives one engine with no arrivals of its own; a workload replay
(`metroline.core.experiments.runner.replay`) drives one engine and delivers each request at its
arrival time; the cluster simulation (`metroline.core.cluster.simulation.run_cluster`) drives N
engines behind a router. All three go through `drive`, so an engine behaves the same, step for
step, whichever runs it:

- the engine whose clock is earliest steps next, once every arrival up to that time is delivered;
- after a step that scheduled nothing the engine is *parked*: before its next step, or before a
  request is delivered to it, its clock moves to the earliest of the wake-up a plugin asked for
  (`ctx.wake_at`), its own pending arrivals and the arriving request (`Engine.idle`); a parked
  engine with none of those waits for the next arrival, or, when none is left, steps anyway;
- steps without progress (`Engine.last_step_progressed`) are counted once no arrival is left to
  deliver, and `is_stalled`'s count of them raises the engine's `NoProgressError`;
- with `gc_every`, the garbage collector's automatic passes are off and the young generations are
  collected every that many steps; it is back on when the loop ends, however it ends.
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .stall import is_stalled

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..errors import NoProgressError
    from .outputs import RequestOutput

GC_EVERY_STEPS = 20_000
"""During a replay, the young generations of the garbage collector are collected every this many
steps (and the automatic collector is off): its full passes would walk every live object (the
workload, the prefix index, the records) again and again, for garbage the step does not make (it
makes no reference cycles of its own)."""


class Drivable(Protocol):
    """What the loop uses of an engine (`metroline.core.step.engine.Engine`)."""

    config: EngineConfig
    executor: Any
    last_plan_empty: bool
    last_step_progressed: bool

    def has_unfinished(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...

    def advance(self) -> None: ...

    def wake_time(self) -> float | None: ...

    def idle(self, next_arrival: float | None = None) -> None: ...

    def stalled(self, steps: int) -> NoProgressError: ...


class Driver:
    """One engine under the driving loop: whether it is parked (its last step scheduled nothing)
    and how many steps in a row made no progress (`idle_steps`). `outputs`: keep each step's
    outputs in `last_outputs` (`Engine.step`), or not (`Engine.advance`, a replay's)."""

    __slots__ = ("engine", "max_idle_steps", "idle_steps", "parked", "outputs", "last_outputs")

    def __init__(self, engine: Drivable, max_idle_steps: int = 1000, outputs: bool = False) -> None:
        self.engine = engine
        self.max_idle_steps = max_idle_steps
        self.idle_steps = 0
        self.parked = False
        self.outputs = outputs
        self.last_outputs: list[RequestOutput] = []

    def next_time(self, arrivals_left: bool) -> float | None:
        """When this engine steps next (None: it has nothing to do)."""
        engine = self.engine
        if self.parked:
            t = engine.wake_time()
            if t is not None:
                return t
            return math.inf if arrivals_left else engine.executor.now()
        if engine.has_unfinished():
            return engine.executor.now()
        return None

    def before_arrival(self, arrival_s: float) -> None:
        """A request arriving at `arrival_s` is about to be delivered: an engine whose last step
        scheduled nothing, or that has nothing to do, moves its clock up to it."""
        engine = self.engine
        if self.parked:
            self.parked = False
            engine.idle(arrival_s)
        elif not engine.has_unfinished():
            engine.executor.idle_until(arrival_s)

    def step(self, counting: bool) -> None:
        """Step the engine (woken first when parked); `counting`: count a step without progress
        toward a stall (no arrival is left to deliver)."""
        engine = self.engine
        if self.parked:
            self.parked = False
            engine.idle(None)
        if self.outputs:
            self.last_outputs = engine.step()
        else:
            engine.advance()
        if engine.last_step_progressed:
            self.idle_steps = 0
            return
        if engine.last_plan_empty:
            self.parked = True
        if counting:
            self.idle_steps += 1
            if is_stalled(self.idle_steps, self.max_idle_steps, engine.last_plan_empty, engine.config.max_kv_tokens):
                raise engine.stalled(self.idle_steps)


def drive(
    drivers: list[Driver],
    arrivals: Sequence[float] = (),
    deliver: Callable[[int], object] | None = None,
    *,
    until: float = math.inf,
    gc_every: int | None = None,
) -> Iterator[Driver]:
    """Step `drivers`' engines in time order until none has anything left to do and every arrival
    is delivered, or the earliest clock reaches `until`; yields each driver after each of its
    steps. `arrivals`: arrival times, in order; `deliver(i)` routes and submits arrival `i` (those
    at or after `until` are not), calling `Driver.before_arrival` of the driver it goes to first.
    See the module docstring for idling, stalls and `gc_every`."""
    total = len(arrivals)
    deliverable = total if until == math.inf else bisect_left(arrivals, until)
    i = 0
    countdown = gc_every or 0
    gc_was_enabled = gc.isenabled()
    if gc_every:
        gc.disable()
    try:
        while True:
            nxt, t_min = None, math.inf  # the driver that steps next, and its clock
            left = i < total
            for d in drivers:
                t = d.next_time(left)
                if t is not None and t < t_min:
                    nxt, t_min = d, t
            if i < deliverable and arrivals[i] <= t_min:
                deliver(i)
                i += 1
                continue
            if nxt is None or t_min >= until:
                return
            nxt.step(counting=not left)
            if gc_every:
                countdown -= 1
                if not countdown:
                    gc.collect(1)
                    countdown = gc_every
            yield nxt
    finally:
        if gc_every and gc_was_enabled:
            gc.enable()
