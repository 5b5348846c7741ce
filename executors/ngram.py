"""N-gram prompt lookup, vLLM's `ngram` drafter: drafts copied from where the context repeated itself.

For `n` from `prompt_lookup_max` down to `prompt_lookup_min`, the last `n` tokens of a sequence
are looked for earlier in its tokens (prompt and output); at the latest earlier occurrence, the up
to `k` tokens that followed it are the drafts. No match: no drafts. It costs a scan of the
sequence's tokens per drafting step, no model.
"""

from __future__ import annotations

from collections.abc import Sequence as Tokens


def ngram_propose(token_ids: Tokens[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to `k` draft tokens for `token_ids` by prompt lookup (see the module docstring)."""
    length = len(token_ids)
    if k <= 0:
        return []
    ids = list(token_ids)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = ids[length - n :]
        first = suffix[0]
        # the latest earlier start i (i + n <= length - 1) with ids[i:i + n] == suffix
        i = length - n - 1
        while i >= 0:
            if ids[i] == first and ids[i : i + n] == suffix:
                return ids[i + n : i + n + k]
            i -= 1
    return []
