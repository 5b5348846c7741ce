"""`AdmissionQueue`: vLLM's waiting queue whose order is metroline's `admission` hook.

vLLM's scheduler takes waiting requests through its `RequestQueue` interface: it peeks at the
head, pops it (to admit it, or to skip it for a reason of its own: a grammar not compiled yet, a
LoRA limit) and puts skipped ones back with `prepend_requests`. Here the head is the next candidate
of the plugins' answer to `admission`, pulled lazily: the hook is called once per step, at the
first look at the queue in the step's admission phase while vLLM has a free running slot
(`can_admit`; without one vLLM stops its admission right after that look, so the queue answers
from its members), and stale candidates (no longer waiting) are passed over. Outside a step the
queue is the set of waiting requests in the order they came.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from vllm.v1.core.sched.request_queue import RequestQueue

from metroline.core.errors import PluginError
from metroline.core.plugins.candidates import Candidates, close_candidates
from metroline.core.requests.sequence import WAITING


class AdmissionQueue(RequestQueue):
    """The waiting requests; in a step, in the order of the plugins' candidates (see the module)."""

    def __init__(self, bridge: Any) -> None:
        self._bridge = bridge
        self._members: dict[Any, None] = {}
        self._in_step = False
        self._answer: Candidates | None = None
        self._iter: Iterator[Any] | None = None
        self._head: Any = None
        self._pulled = 0
        self._limit = 0
        self.popped: list[Any] = []
        """The requests popped in the step under way (admitted, or skipped by vLLM)."""
        self.head_of_line = True
        self.can_admit: Callable[[], bool] = lambda: True
        """Whether vLLM's step may admit a request now (a free running slot): the scheduler's."""

    # --- the step ------------------------------------------------------------------------------

    def open_step(self, closed: bool = False) -> None:
        """The step's schedule starts: the next look at the head asks `admission` (`closed`: the
        step offers no candidate, and the hook is not asked)."""
        self._in_step = True
        self._answer = self._head = None
        self._iter = iter(()) if closed else None
        self.popped = []

    def close_step(self) -> None:
        """The step's schedule ended: the candidates' generator is closed (a policy's lazy queue
        puts back what was not admitted)."""
        self._in_step = False
        if self.popped:
            self._bridge.settle_popped(self.popped)
        if self._iter is not None:
            close_candidates(self._iter)
        self._answer = self._iter = self._head = None

    def _next_candidate(self) -> Any:
        """The next waiting request of the plugins' answer, or None. A `PluginError` of one
        request (raised while answering or pulling) fails that request, and `admission` is asked
        again without it; an error of no request is raised."""
        bridge = self._bridge
        while True:
            try:
                return self._pull()
            except PluginError as exc:
                seq = bridge.failed_request(exc)
                if seq is None:
                    raise
                bridge.fail(seq, exc)
                if self._iter is not None:
                    close_candidates(self._iter)
                self._answer = self._iter = None

    def _pull(self) -> Any:
        bridge = self._bridge
        if self._iter is None:
            if not self._members:
                return None
            answer = bridge.plugins.hook.admission(ctx=bridge.ctx)
            if answer is None:
                return None
            self._answer = Candidates.of(answer)
            self.head_of_line = self._answer.head_of_line
            if not self.head_of_line:
                bridge.note_approximation(
                    "admission", "a head_of_line=False answer: vLLM stops its admission at the first "
                    "candidate whose blocks do not fit")
            self._iter = iter(self._answer)
            self._pulled = 0
            self._limit = 2 * (len(self._members) + len(bridge.running)) + 8
        if self.popped:
            bridge.settle_popped(self.popped)
        request_of, members = bridge.request_of, self._members
        for seq in self._iter:  # checked by the relay: an exception while yielding is a PluginError
            self._pulled += 1
            if self._pulled > self._limit:
                raise bridge.plugins.invalid(
                    "admission", f"more than {self._limit} candidates pulled in one step (an endless answer?)")
            request = request_of.get(seq)
            if request is None:
                raise bridge.plugins.invalid("admission", f"candidate {seq!r} is not a request of this engine")
            if seq.state is WAITING and request in members:
                return request
        return None

    def _peek(self) -> Any:
        if self._head is None:
            self._head = self._next_candidate()
        return self._head

    # --- vLLM's RequestQueue -------------------------------------------------------------------

    def add_request(self, request: Any) -> None:
        self._members[request] = None

    def prepend_request(self, request: Any) -> None:
        self._members[request] = None

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        for request in requests:
            self._members[request] = None

    def pop_request(self) -> Any:
        request = self.peek_request()
        self._head = None
        del self._members[request]
        self.popped.append(request)
        return request

    def peek_request(self) -> Any:
        if not self._in_step:
            if not self._members:
                raise IndexError("peek from an empty queue")
            return next(iter(self._members))
        request = self._peek()
        if request is None:
            raise IndexError("no candidate left in this step")
        return request

    def remove_request(self, request: Any) -> None:
        self._members.pop(request, None)

    def remove_requests(self, requests: Iterable[Any]) -> None:
        for request in requests:
            self._members.pop(request, None)

    def __bool__(self) -> bool:
        if not self._in_step or (self._iter is None and self._members and not self.can_admit()):
            return bool(self._members)
        return self._peek() is not None

    def __contains__(self, request: Any) -> bool:
        return request in self._members

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._members))
