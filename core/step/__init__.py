"""The step: `Engine.step` plans with the scheduler, runs the executor, commits the tokens.

Read top-down:
- `engine.py`: `Engine`, the loop around scheduler and executor (`step`, `run`, `stream`);
- `intake.py`: adding, validating and cancelling requests;
- `scheduler.py`: one `schedule()` per step, in the phases of the architecture guide's "One step" (docs/architecture.md): `admission.py` (waiting
  and swapped requests boarding), `victim_loop.py` (preemption when blocks run out), `rescue.py`
  (the core's own progress rescue), `step_prefix.py` (prefix blocks shared within the step),
  `forking.py` (`n > 1` children);
- `plan.py`: `StepPlan` (what the executor runs) and `StepResult`;
- `context.py`: `StepContext`, what every hook sees;
- `outputs.py`: appending sampled tokens, stop checks, `RequestOutput`;
- `recovery.py` (after a plugin error), `stall.py` (diagnosing a stalled engine);
- `async_engine.py`: the engine under asyncio (serving); `lifecycle_log.py`: `--debug` events.
"""
