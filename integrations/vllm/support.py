"""Which of metroline's hooks map onto vLLM's scheduler, and how; the start-up check.

`SUPPORT[hook] = (level, how)`: "exact" (decided by the hook as in metroline's `--preset vllm`),
"approximate" (honoured within what vLLM's step can do; `how` says where it differs) or "not"
(cannot be honoured inside vLLM: a plugin that implements it is refused when the scheduler
starts, naming the plugin and the hook). docs/guide/vllm.md shows this table.
"""

from __future__ import annotations

from typing import Any

SUPPORT: dict[str, tuple[str, str]] = {
    "check_request": ("exact", "asked at add_request; a refusal (or an exception) ends that request as an error "
                      "(finish reason 'error') and logs the plugin's reason (or error)"),
    "admission": ("exact", "orders vLLM's waiting queue, pulled lazily; a head_of_line=False answer is served "
                  "head-of-line (vLLM stops admitting at the first candidate whose blocks do not fit), logged once"),
    "order_running": ("exact", "the order of vLLM's running list for the step; requests left out get no tokens"),
    "select_victim": ("approximate", "exact for a running request that lacks blocks (recompute), but a "
                      "requester named as its own victim ends vLLM's step there (no running request after it is "
                      "served); a swap answer is served as recompute (vLLM has no swap space); never asked for a "
                      "waiting candidate (vLLM's waiting requests never preempt)"),
    "split_budget": ("approximate", "decode + prefill becomes the step's token budget and max_chunk vLLM's "
                     "long-prefill threshold (which vLLM applies only when more than one request is eligible); "
                     "the decode/prefill partition is one budget in vLLM; max_prefills and shares are refused"),
    "estimate_output_tokens": ("exact", "asked by plugins, as in metroline"),
    "on_arrival": ("exact", "at the first step after add_request"),
    "on_admitted": ("exact", "after the step's schedule"),
    "on_preempted": ("exact", "after the step's schedule (vLLM admits nothing in a step that preempted)"),
    "on_tokens": ("exact", "after update_from_output"),
    "on_step_end": ("exact", "after update_from_output; the plan holds scheduled, admitted, preempted and "
                    "sample_seqs (no block operations: the blocks are vLLM's)"),
    "on_finished": ("exact", "when vLLM finishes, aborts or fails a request"),
    "sample": ("not", "vLLM samples on its workers; the bridge does not translate sample plugins into "
               "logits processors"),
    "num_draft_tokens": ("not", "vLLM's drafter decides the drafts of each request"),
    "route": ("not", "a cluster router's hook; one vLLM engine is one replica"),
}


class UnsupportedHookError(RuntimeError):
    """A loaded plugin implements a hook the bridge cannot honour inside vLLM."""


def refuse_unsupported(plugins: Any) -> None:
    """Raise `UnsupportedHookError` naming each loaded plugin (but metroline's defaults) that
    implements a hook whose level is "not"."""
    bad = [(name, hook) for name, hooks in plugins.describe() if name != "defaults"
           for hook in hooks if SUPPORT.get(hook, ("not", ""))[0] == "not"]
    if bad:
        lines = "; ".join(f"plugin {name!r} implements {hook!r} ({SUPPORT.get(hook, ('', 'unknown hook'))[1]})"
                          for name, hook in bad)
        raise UnsupportedHookError(f"metroline.integrations.vllm cannot honour these hooks inside vLLM: {lines}")
