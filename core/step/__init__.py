"""The step: `Engine.step` plans with the scheduler, runs the executor, commits the tokens.

Read top-down:
- `engine.py`: `Engine`, around scheduler and executor (`step`, `run`, `stream`); `intake.py`:
  `Intake`, requests in (adding, validating, refusing; the table of requests); `reaping.py`:
  `Reaper`, requests out (reap, failure, aborted requests' ends); `driving.py`: the one driving loop (idling, stalls)
  that `Engine.stream`, replays and the cluster simulation share;
- `scheduler.py`: `Scheduler`, one `schedule()` per step, phase by phase, each phase a function or
  a small object that receives what it uses: `split.py` (`split_budget`), `running.py` (the
  running sequences), `admission.py` (waiting and swapped requests boarding, `Outcome` in
  `outcome.py`), `reserves.py` (the tenants' reserved shares), `victim_loop.py` (preemption when
  slots or blocks run out), `rescue.py` (the core's own progress rescue), `forking.py` (`n > 1`
  children); `step_state.py`: `StepState`, the step's scratch state; `queues.py`: `Queues`;
  `step_prefix.py`: prefix blocks shared within the step;
- `plan.py`: `StepPlan` (the output record the executor runs) and `StepResult`;
- `sample.py`: the sample phase; `outputs.py`: appending sampled tokens, stop checks,
  `RequestOutput`;
- `context.py`: `StepContext`, what every hook sees;
- `recovery.py` (after a plugin error), `stall.py` (diagnosing a stalled engine);
- `async_engine.py`: the engine under asyncio (serving); `lifecycle_log.py`: `--debug` events.
"""
