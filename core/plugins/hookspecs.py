"""Every hook a metroline plugin can implement, specified in one place.

A plugin is a plain object (a module, or an instance of a class) whose methods are marked with
`@hookimpl` and named like the functions below. Implement only the hooks you need; arguments are
passed by name, so an implementation may accept any subset of them.

Decision hooks are `firstresult`: plugins are called newest-registered first (a plugin stacked on
a base policy runs before it), and the first answer that is not None wins; the built-in defaults
(`metroline.core.plugins.defaults`) answer last. A `wrapper=True` implementation sees the answer of the ones
below it (`answer = yield`) and may return a changed one; an old-style `hookwrapper=True` one may
`outcome.force_result(...)`. Observers (`on_*`) are called on every plugin; their return values
are ignored. Each hook is called a bounded number of times per step, with batches.

The step protocol: the hooks one `Engine.step` calls, in this order (`?`: at most once, `*`: any
number of times, `a|b`: either; an observer nobody implements is skipped). `STEP_PROTOCOL` is
parsed from this list and the tests check every step against it (tests/test_hook_order.py)::

    on_arrival*                    once per request that arrived since the last step
    split_budget                   every step
    num_draft_tokens?              speculative decoding on and sequences decode
    order_running?                 when sequences run
    select_victim*                 blocks for the running sequences: once per victim
    on_preempted?                  their victims, before admission
    admission?                     when requests wait (not after a preemption if the preset says so)
    (select_victim|on_preempted)*  slots and blocks for candidates; victims before the next one
    on_preempted?                  the rescue's victims (the core chose them: no select_victim)
    on_admitted?                   the step's admissions, then the samples forked in it
    on_preempted?                  the victims not told yet
    sample*                        when sequences reached the end of their known tokens; again per accepted draft
    on_tokens?                     the sequences that got a token
    on_step_end                    every step, an empty one included
    on_finished?                   the reap: the sequences that ended in the step

Outside the protocol: `estimate_output_tokens` is asked by plugins (`ctx.hook`), from their own
hooks or their admission generator; `check_request` runs in `Engine.add_request`; `on_finished`
also runs in `Engine.abort`, between steps. A step that a `PluginError` interrupts stops where it is.

Answers are checked where they are given (`metroline.core.plugins.answers`): the wrong type (a candidate that is
not a `Sequence`, shares over 1, a negative estimate, ...) is a `PluginError` naming the plugin,
or the wrapper, that answered. What needs the engine's state (a victim that is not running, a
split above the budget) is checked where it is used, after every wrapper, naming the plugin that
answered and the wrappers it went through. An exception raised by any implementation, wrappers
included, is a `PluginError` naming that plugin and the hook. The error leaves the engine
consistent, and what it fails depends on whether it is one request's (see docs/architecture.md,
"Plugin errors"): an error of a hook called for one request alone (`on_arrival`, delivered one
request at a time; `estimate_output_tokens` and `check_request`, asked for one sequence) or of
one row of a `sample` answer fails that request only (`PluginError.request_id` names it), the
step goes on for the others and `Engine.step` raises the error when the step is done; any other
interrupts the step, and the requests it may have left in doubt end as `failed`
(`metroline.core.step.recovery`). An observer still reaches every other implementation (the
first error is raised after all ran).

`ctx` is the `StepContext` of the engine: `ctx.now`, `ctx.step`, `ctx.config`, `ctx.running`,
`ctx.waiting`, `ctx.swapped`, `ctx.num_free_blocks()`, ... (see `metroline.core.step.context`).

The hooks are specified by kind, each in its module and all re-exported here (pluggy reads them
from this module): the decisions in `metroline.core.plugins.decision_hooks`, `check_request` and
`route` in `metroline.core.plugins.edge_hooks`, the observers in
`metroline.core.plugins.observer_hooks`; the markers `hookspec` and `hookimpl` in
`metroline.core.plugins.markers`.
"""

from __future__ import annotations

from .decision_hooks import (
    admission,
    select_victim,
    split_budget,
    order_running,
    num_draft_tokens,
    sample,
    estimate_output_tokens,
)
from .edge_hooks import check_request, route
from .markers import PROJECT, hookimpl, hookspec
from .observer_hooks import (
    on_arrival,
    on_admitted,
    on_preempted,
    on_tokens,
    on_finished,
    on_step_end,
)

__all__ = [
    "PROJECT", "hookimpl", "hookspec", "DECISION_HOOKS", "OBSERVER_HOOKS", "EDGE_HOOKS", "ROUTING_HOOKS", "STEP_PROTOCOL",
    "admission",
    "select_victim",
    "split_budget",
    "order_running",
    "num_draft_tokens",
    "sample",
    "estimate_output_tokens",
    "check_request",
    "route",
    "on_arrival",
    "on_admitted",
    "on_preempted",
    "on_tokens",
    "on_finished",
    "on_step_end",
]

DECISION_HOOKS = (
    "admission", "select_victim", "split_budget", "order_running", "num_draft_tokens", "sample", "estimate_output_tokens",
)
OBSERVER_HOOKS = ("on_arrival", "on_admitted", "on_preempted", "on_tokens", "on_finished", "on_step_end")
EDGE_HOOKS = ("check_request",)
ROUTING_HOOKS = ("route",)
"""Hooks of a cluster's router, called outside any engine (`core/cluster/`)."""


def _step_protocol(doc: str) -> tuple[tuple[tuple[str, ...], str], ...]:
    """The step protocol's lines of the module docstring (see `STEP_PROTOCOL`)."""
    block = doc.split("tests/test_hook_order.py)::", 1)[1].split("\n\n", 2)[1]
    steps = []
    for line in block.splitlines():
        token = line.split()[0]
        repeat = token[-1] if token[-1] in "?*" else ""
        steps.append((tuple(token.rstrip("?*").strip("()").split("|")), repeat))
    return tuple(steps)


STEP_PROTOCOL = _step_protocol(__doc__) if __doc__ else ()  # no docstrings under python -OO
"""The module docstring's step protocol: `(hooks, repeat)` per line; `repeat` is `""` (once), `"?"`
or `"*"`."""
