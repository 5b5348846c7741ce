"""A tenant's token-rate quota at the door (a server's, or the front's for all its replicas): what a
request reserves, the refusal of one that could never be paid for, and the usage a replica
reports back to the front that reserved for it.

A request reserves its prompt tokens plus `max_tokens x n`, every prompt of a batch, all at once
(`tenant_quota`'s `reserve`; its unused part is refunded when it ends). One asking for more than its
tenant's `burst` could only be paid by a bucket fuller than it ever is: it is refused at once
(400, `code: request_too_large`, naming the field and the limit), as hosted APIs refuse a request
too large for the limit, rather than wait for a full bucket and drive it below zero.

Behind a front (`serve --replicas N`) the quota is the front's: one bucket per tenant for all the
replicas, so a tenant gets its rate once, not N times. The front sends each request with
`FRONT_HEADER` (its own operator key at the replicas); a replica that sees it reserves nothing
itself and ends each stream it serves with an SSE comment, `: metroline-usage TOKENS` (ignored by
SSE clients; the front takes it out), from which the front refunds the unused part; a request
not streamed carries its `usage` in its body.
"""

from __future__ import annotations

from typing import Any

from .reading import Refused

FRONT_HEADER = "x-metroline-front"
"""The request header by which a replica knows the front sent a request (the front's key)."""
USAGE_COMMENT = b": metroline-usage "
"""The start of the SSE comment line a replica ends a stream with for the front: the tokens used."""


def usage_comment(tokens: int) -> str:
    return f"{USAGE_COMMENT.decode()}{tokens}\n\n"


def quota_of_config(config: Any) -> Any:
    """The `tenant_quota` plugin `config` (an `EngineConfig`) stacks, built apart (the front's own
    copy of it, for its buckets), when it limits a token rate; else None."""
    from ..plugins.loader import instantiate, plugin_name, resolve

    for spec in config.plugins:
        target = resolve(spec)
        name = plugin_name(target, spec)
        if name == "tenant_quota":
            quota = instantiate(spec, target, config.options_for(name, spec))[1]
            return quota if getattr(quota, "_rated", False) else None
    return None


def too_large(quota: Any, tenant: str, prompt_tokens: int, asked: int, max_tokens: int, n: int, prompts: int,
              now: float) -> Refused | None:
    """The refusal of a request asking its tenant's bucket for more than `burst` tokens (`asked`:
    its prompts' `prompt_tokens` plus `max_tokens x n` for each of its `prompts`), else None."""
    bucket = quota.bucket(tenant, now)
    if bucket is None:
        return None
    if asked <= bucket.burst:
        return None
    burst = f"{bucket.burst:,.0f}"
    if prompt_tokens > bucket.burst:
        return Refused(400, f"the prompt has {prompt_tokens:,} tokens, more than tenant {tenant!r}'s token-rate burst "
                       f"of {burst} tokens: no request of it can ever be paid for", param="prompt",
                       code="request_too_large", reason="quota")
    batch = f" x {prompts} prompts" if prompts > 1 else ""
    return Refused(400, f"this request asks for {asked:,} tokens (prompt {prompt_tokens:,} + max_tokens {max_tokens:,} "
                   f"x n {n}{batch}), more than tenant {tenant!r}'s token-rate burst of {burst} tokens: lower "
                   "max_tokens or n", param="max_tokens", code="request_too_large", reason="quota")


def reserve_all(quota: Any, tenant: str, asks: list[tuple[str, int]], now: float) -> None:
    """Reserve each (request id, tokens) of `asks` in `tenant`'s bucket, all or none: a bucket
    that cannot pay now raises `Refused` 429 with the seconds until it can."""
    done: list[str] = []
    for rid, tokens in asks:
        wait = quota.reserve(tenant, rid, tokens, now)
        if wait is not None:
            for d in done:
                quota.settle(d, 0, now)
            refused = Refused(429, f"tenant {tenant!r} is over its token-rate quota ({tokens} tokens asked: the "
                              "prompt and max_tokens x n)", "rate_limit_error", reason="quota", retry_after=wait)
            refused.tenant = tenant
            raise refused
        done.append(rid)


def used_in(chunk: bytes) -> tuple[bytes, int | None]:
    """`chunk` of a relayed stream without the replica's usage comment, and the tokens it names
    (None when the chunk holds none)."""
    at = chunk.find(USAGE_COMMENT)
    if at < 0:
        return chunk, None
    end = chunk.find(b"\n\n", at)
    if end < 0:
        return chunk, None
    try:
        used = int(chunk[at + len(USAGE_COMMENT):end])
    except ValueError:
        return chunk, None
    return chunk[:at] + chunk[end + 2:], used
