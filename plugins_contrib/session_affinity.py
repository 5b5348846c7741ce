"""`session_affinity`: let the next turn of a recently active session, whose prefix is still cached,
board ahead of a bounded window of older requests (the bounded session-affinity scheduler proposed
to vLLM in PR #51384). An admission wrapper: it stacks on any base policy."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from typing import Any

from pydantic import Field

from metroline.api import (
    Candidates,
    PluginOptions,
    Sequence,
    StepContext,
    close_candidates,
    hookimpl,
    take_options,
)


class SessionAffinity:
    """Promote at most one cache-warm continuation of a recently active session per step.

    A multi-turn conversation or an agent sends its next request soon after the last one ended;
    its prompt starts with the whole previous exchange, whose KV blocks are still in the prefix
    cache unless a busy engine evicts them before the turn's FCFS place comes. This plugin lets
    such a turn go first, within bounds:

    - A request's session is `seq.metadata[session_key]` (OpenAI's `metadata` over HTTP, a
      request file's `metadata`). A request without one has no session, unless `prefix_tokens` is
      set: then its first `prefix_tokens` prompt tokens name its session (for traces that carry
      prefix structure but no session ids: a conversation's turns share their first tokens).
    - A session is active for `session_ttl_s` seconds after a request of it was admitted or ended.
    - Each step with a free slot, it looks at the first `window` candidates of the base policy's
      answer and moves to the front the first one (after the head) whose session is active and of
      whose prompt the prefix cache holds at least `min_cached_blocks` blocks
      (`ctx.cached_prefix_tokens`). The rest keep the base's order and head-of-line choice.
    - Never past a preempted request: only candidates ahead of the first one that was preempted
      are considered (a preempted head: none is).
    - Not when the head has waited `max_head_wait_s` seconds or more: ordering is then the base
      policy's until the head boards. So the head waits at most `max_head_wait_s` plus one
      promoted request per step on top of what the base policy makes it wait.

    Options: see `SessionAffinity.Options`. Cost per step with a free slot and an active session:
    O(window) candidates pulled from the base answer and up to `window` prefix-cache lookups
    (O(cached blocks + 1) each); O(1) per observed sequence to keep the sessions' times.
    """

    name = "session_affinity"

    class Options(PluginOptions):
        """`[plugin_options.session_affinity]`."""

        session_key: str = Field(default="session_id", description="the request metadata field naming its session")
        prefix_tokens: int | None = Field(
            default=None, ge=1,
            description="for a request without the metadata field: its first N prompt tokens name its session "
            "(None: it has no session)",
        )
        window: int = Field(default=16, ge=2, description="how many of the base policy's first candidates are looked at")
        min_cached_blocks: int = Field(default=1, ge=1, description="the cached prefix blocks a promoted request needs")
        max_head_wait_s: float = Field(
            default=1.0, ge=0, allow_inf_nan=False,
            description="no promotion once the first candidate has waited this long (seconds)",
        )
        session_ttl_s: float = Field(
            default=30.0, gt=0, allow_inf_nan=False,
            description="how long a session stays active after a request of it was admitted or ended (seconds)",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self.last_seen: dict[Any, float] = {}
        """session -> the engine time a request of it was last admitted or ended."""

    def session(self, seq: Sequence) -> Any:
        """The session of `seq`, or None."""
        found = seq.metadata.get(self.options.session_key)
        if found is None and self.options.prefix_tokens is not None:
            n = min(self.options.prefix_tokens, seq.num_prompt_tokens)
            found = ("prefix", tuple(seq.token_ids[:n]))
        return found

    def _touch(self, ctx: StepContext, seqs: Iterable[Sequence]) -> None:
        for s in seqs:
            session = self.session(s)
            if session is not None:
                self.last_seen[session] = ctx.now

    @hookimpl
    def on_admitted(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        self._touch(ctx, seqs)

    @hookimpl
    def on_finished(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        self._touch(ctx, seqs)
        ttl = self.options.session_ttl_s
        if len(self.last_seen) > 1024:  # forget expired sessions now and then
            self.last_seen = {k: t for k, t in self.last_seen.items() if ctx.now - t < ttl}

    @hookimpl(wrapper=True)
    def admission(self, ctx: StepContext) -> Generator[None, Any, Any]:
        answer = yield
        if answer is None or not self.last_seen or len(ctx.running) >= ctx.config.max_num_seqs:
            return answer
        return Candidates(self._promoted(ctx, answer), getattr(answer, "head_of_line", True))

    def _promoted(self, ctx: StepContext, answer: Iterable[Sequence]) -> Iterator[Sequence]:
        rest = iter(answer)
        window: list[Sequence] = []
        try:
            for seq in rest:
                window.append(seq)
                if len(window) == self.options.window:
                    break
            chosen = self._choose(ctx, window)
            if chosen is not None:
                window.remove(chosen)
                yield chosen
            yield from window
            yield from rest
        finally:
            close_candidates(rest)  # the base policy takes back what was not pulled

    def _choose(self, ctx: StepContext, window: list[Sequence]) -> Sequence | None:
        if len(window) < 2 or window[0].num_preemptions or ctx.now - window[0].arrival_time >= self.options.max_head_wait_s:
            return None
        ttl, need = self.options.session_ttl_s, self.options.min_cached_blocks * ctx.block_size
        for seq in window[1:]:
            if seq.num_preemptions:
                return None  # never past a preempted request
            seen = self.last_seen.get(self.session(seq))
            if seen is not None and ctx.now - seen < ttl and ctx.cached_prefix_tokens(seq) >= need:
                return seq
        return None
