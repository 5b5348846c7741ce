"""Checks of the answers plugins give to decision hooks and `check_request`: a bad one is a
`PluginError` naming the plugin that gave the answer (not the one that consumed it) and the hook.

The plugin layer (`PluginManager`) applies `check_answer` to every implementation's answer, wrappers
included, so a bad answer is caught where it is given. Checks that need the engine's state (a
victim that is not running, a token list of the wrong length, a share above the budget) stay where
the answer is used; the helpers here (`tokens_problem`, `split_problem`) are for those places.

Cheap by design: a type test per answer and, for `admission`, one `isinstance` per candidate pulled.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import PluginError
from ..requests.sequence import Sequence
from .candidates import Candidates, close_candidates


def _is_int(x: Any) -> bool:
    return type(x) is int or (isinstance(x, int) and not isinstance(x, bool))


def _iterable(answer: Any) -> bool:
    return hasattr(answer, "__iter__") and not isinstance(answer, (str, bytes, bytearray))


def _describe(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _checked_candidates(items: Iterator[Any], plugin: str) -> Iterator[Sequence]:
    """`items`, with a `PluginError` naming `plugin` for an item that is not a `Sequence` or an
    exception raised while producing one."""
    try:
        while True:
            try:
                seq = next(items)
            except StopIteration:
                return
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(plugin, "admission", f"its candidates raised {type(exc).__name__}: {exc}") from exc
            if not isinstance(seq, Sequence):
                raise PluginError(plugin, "admission", f"yielded {_describe(seq)}, not a Sequence")
            yield seq
    finally:
        close_candidates(items)


def _admission(plugin: str, answer: Any) -> Any:
    if isinstance(answer, Candidates):
        return Candidates(_checked_candidates(iter(answer), plugin), answer.head_of_line)
    if not _iterable(answer):
        raise PluginError(plugin, "admission", f"expected an iterable of sequences or Candidates, got {_describe(answer)}")
    return Candidates(_checked_candidates(iter(answer), plugin), True)


def _order_running(plugin: str, answer: Any) -> Any:
    if not _iterable(answer):
        raise PluginError(plugin, "order_running", f"expected an iterable of running sequences, got {_describe(answer)}")
    return answer


def split_problem(split: Any) -> str | None:
    """What is wrong with a `split_budget` answer on its own: the types of its fields, and
    `shares` (finite fractions >= 0 of tenants, summing to at most 1). Its ranges against the
    step's budget are checked by the scheduler. None when nothing is."""
    if not isinstance(split, tuple) or not 3 <= len(split) <= 5:
        return f"expected Split(decode, prefill, max_chunk), optionally with max_prefills and shares, got {_describe(split)}"
    for field, value in zip(("decode", "prefill", "max_chunk", "max_prefills"), split):
        if field == "max_prefills" and value is None:
            continue
        if not _is_int(value):
            return f"Split.{field} must be an int, got {_describe(value)}"
    return shares_problem(split[4]) if len(split) == 5 else None


def shares_problem(shares: Any) -> str | None:
    """What is wrong with a `Split.shares` mapping (tenant -> fraction of the budget, each in
    [0, 1], summing to at most 1), as the one-line message the core gives for it; None when
    nothing is. A plugin validates shares it builds from its options with it (`tenant_shares`)."""
    if shares is None:
        return None
    if not isinstance(shares, Mapping):
        return f"Split.shares must be a mapping of tenant -> fraction, got {_describe(shares)}"
    total = 0.0
    for tenant, fraction in shares.items():
        if not isinstance(tenant, str):
            return f"Split.shares: tenant names are strings, got {_describe(tenant)}"
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            return f"Split.shares[{tenant!r}] must be a fraction in [0, 1], got {_describe(fraction)}"
        total += fraction
    if total > 1 + 1e-9:
        return f"Split.shares sum to {total:g}, more than the whole budget (1)"
    return None


def _split_budget(plugin: str, answer: Any) -> Any:
    problem = split_problem(answer)
    if problem:
        raise PluginError(plugin, "split_budget", problem)
    return answer


def _select_victim(plugin: str, answer: Any) -> Any:
    seq = answer[0] if isinstance(answer, tuple) and len(answer) == 2 else answer
    if not isinstance(seq, Sequence):
        raise PluginError(plugin, "select_victim", f"expected a running Sequence or Preempt(seq, mode), got {_describe(answer)}")
    return answer


def token_problem(token: Any, vocab_size: int | None) -> str | None:
    """What is wrong with one token id of a `sample` answer (an int in [0, vocab_size)), or None."""
    if type(token) is not int and not _is_int(token):
        return f"token ids must be ints, got {_describe(token)}"
    if token < 0 or (vocab_size is not None and token >= vocab_size):
        limit = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
        return f"token id {token} is outside {limit}"
    return None


def tokens_problem(tokens: Any, n: int, vocab_size: int | None) -> str | None:
    """What is wrong with a `sample` answer for `n` sequences (token ids must be ints in
    [0, vocab_size)), or None."""
    if not isinstance(tokens, list) or len(tokens) != n:
        got = f"{len(tokens)} items" if isinstance(tokens, list) else _describe(tokens)
        return f"expected a list of {n} token ids, got {got}"
    for tok in tokens:
        if type(tok) is not int and not _is_int(tok):
            return f"token ids must be ints, got {_describe(tok)}"
    if tokens and (min(tokens) < 0 or (vocab_size is not None and max(tokens) >= vocab_size)):
        bad = min(tokens) if min(tokens) < 0 else max(tokens)
        limit = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
        return f"token id {bad} is outside {limit}"
    return None


def _estimate_output_tokens(plugin: str, answer: Any) -> Any:
    if not _is_int(answer) or answer < 0:
        raise PluginError(plugin, "estimate_output_tokens", f"expected an int >= 0, got {_describe(answer)}")
    return answer


def _check_request(plugin: str, answer: Any) -> Any:
    if not isinstance(answer, str) or not answer.strip():
        raise PluginError(plugin, "check_request", f"expected a reason (a non-empty string) or None, got {answer!r:.80}")
    return answer


CHECKS = {
    "admission": _admission,
    "order_running": _order_running,
    "split_budget": _split_budget,
    "select_victim": _select_victim,
    "estimate_output_tokens": _estimate_output_tokens,
    "check_request": _check_request,
}
"""hook name -> check(plugin, answer) returning the answer (possibly wrapped to be checked lazily)
or raising `PluginError`. Applied to answers that are not None."""
