"""`GrammarCompiler`: the grammars of structured outputs compiled off the engine's step and off the
event loop, in a thread pool, once per schema (a least-recently-used cache), while the request
waits outside the batch, as vLLM's structured-output manager compiles them while its request
waits in `WAITING_FOR_FSM`.

Compiling a schema builds an llguidance `LLMatcher` from it: the grammar's parser and lexer, about
half a second for a schema near the server's limits (`metroline.core.serving.schema_limits`), and
a schema llguidance cannot use is found there (its message is the answer). Each sequence then runs
on a copy of that matcher (`LLMatcher.deep_copy`, microseconds), so the step never builds one.
llguidance builds without holding the interpreter lock, in threads of lower CPU priority
(`COMPILE_NICENESS`): the step and the event loop go on meanwhile.

`submit(text)` starts (or finds) the compile of a schema and returns its future; `compiling()` says
whether any compile is still running (the admission gate of
`metroline.plugins_contrib.structured_output.StructuredOutputSampler` costs nothing otherwise).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

GRAMMAR_CACHE_SIZE = 256
"""Compiled grammars kept (least recently used dropped first); one per distinct schema."""

COMPILE_NICENESS = 10
"""The nice value of the compile threads (Linux): below the step's priority, so a compile uses the
cores the step leaves idle."""

Compiled = tuple[Any, str | None]
"""A compile's result: (a matcher to copy, None), or (None, why the schema cannot be used)."""


class GrammarCompiler:
    """Compiles JSON schemas into llguidance matchers in `workers` threads.

    `ll_tokenizer()`: llguidance's view of the model's tokenizer (asked for in the worker, when a
    compile starts); `whitespace_flexible`: llguidance's default for JSON whitespace (a schema's own
    `"x-guidance"` key overrides it)."""

    def __init__(self, ll_tokenizer: Callable[[], Any], whitespace_flexible: bool, workers: int = 1,
                 cache_size: int = GRAMMAR_CACHE_SIZE) -> None:
        self.ll_tokenizer = ll_tokenizer
        self.whitespace_flexible = whitespace_flexible
        self.workers = workers
        self.cache_size = cache_size
        self._lock = threading.Lock()  # submissions (the server's loop, a worker) and the step
        self._cache: OrderedDict[str, Future[Compiled]] = OrderedDict()
        self._running: set[Future[Compiled]] = set()
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, text: str) -> Future[Compiled]:
        """The future of the compile of schema `text` (JSON): the cached one, else a new one. Its
        `started` attribute is when (`time.monotonic()`) the compile was asked for."""
        with self._lock:
            future = self._cache.get(text)
            if future is not None:
                self._cache.move_to_end(text)
                return future
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="metroline-grammar",
                                                initializer=_background)
            future = self._pool.submit(self._compile, text)
            future.started = time.monotonic()  # type: ignore[attr-defined]
            self._running.add(future)
            self._cache[text] = future
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        future.add_done_callback(self._done)
        return future

    def compiling(self) -> bool:
        """Whether a compile is still running."""
        return bool(self._running)

    def _done(self, future: Future[Compiled]) -> None:
        with self._lock:
            self._running.discard(future)

    def _compile(self, text: str) -> Compiled:
        try:
            return self.build(text)
        except Exception as exc:  # anything llguidance raises is the schema's problem
            return None, one_line(f"{type(exc).__name__}: {exc}")

    def build(self, text: str) -> Compiled:
        """Compile schema `text` (in a worker thread): its matcher, or llguidance's message."""
        from llguidance import LLMatcher

        grammar = LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_flexible": self.whitespace_flexible})
        matcher = LLMatcher(self.ll_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            return None, one_line(matcher.get_error())
        matcher.compute_bitmask()  # the lexer's first states, built here rather than in the step
        return matcher, None

    def close(self) -> None:
        """Stop the worker threads (compiles under way finish first)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _background() -> None:
    """Lower the calling worker thread's CPU priority (Linux: a thread's own nice value), so that
    on a machine with no idle core the step and the event loop run before a compile."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)


def one_line(message: str) -> str:
    return " ".join(str(message).split())
