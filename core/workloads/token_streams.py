"""Token streams: the prompt tokens of synthetic requests, made from `(key, length)` segments.

A key names an endless pseudo-random token stream and a segment contributes the first `length`
tokens of it. Equal keys give equal tokens, so requests whose leading segments are equal share a
real prompt prefix, which the KV pool's prefix cache can find.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from functools import lru_cache


@lru_cache(maxsize=8)
def _hi_lo_tables(vocab_size: int) -> tuple[bytes | None, bytes | None]:
    """Byte translation tables that fold a little-endian 16-bit value into [0, vocab_size)."""
    if vocab_size >= 1 << 16:
        return None, None
    if vocab_size >= 256:
        return bytes(h % (vocab_size // 256) for h in range(256)), None
    return bytes(256), bytes(b % vocab_size for b in range(256))


@lru_cache(maxsize=128)
def segment_bytes(key: object, length: int, vocab_size: int) -> bytes:
    """The first `length` tokens of the stream named by `key`, as little-endian 16-bit values
    (`array("H", ...)` reads them); several segments' bytes joined make one prompt."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "little"))
    # randbytes(n) is a prefix of randbytes(m > n) only when n is a multiple of 4.
    raw = bytearray(rng.randbytes(4 * ((length + 1) // 2)))
    del raw[2 * length :]
    hi, lo = _hi_lo_tables(vocab_size)
    if hi is not None:
        raw[1::2] = raw[1::2].translate(hi)
    if lo is not None:
        raw[0::2] = raw[0::2].translate(lo)
    return bytes(raw)


def segment_tokens(key: object, length: int, vocab_size: int = 32000) -> list[int]:
    """The first `length` tokens of the stream named by `key`, each in [0, vocab_size).

    The stream depends only on `repr(key)` (through a stable digest, never Python's salted hash),
    so it is the same in every process; a shorter segment of a key is a prefix of a longer one.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    return array("H", segment_bytes(key, length, vocab_size)).tolist()
