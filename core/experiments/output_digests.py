"""What each request of a replay produced, as a digest: how `compare` checks that the policies of a
deterministic run (`EngineConfig.deterministic`) gave every request the same outputs."""

from __future__ import annotations

import hashlib
from typing import Any

from ..plugins.hookspecs import hookimpl


class OutputDigests:
    """An `on_finished` plugin keeping, per sequence id, a digest of its output token ids."""

    name = "output_digests"

    def __init__(self) -> None:
        self.digests: dict[str, str] = {}

    @hookimpl
    def on_finished(self, ctx: Any, seqs: list[Any]) -> None:
        for seq in seqs:
            tokens = ",".join(map(str, seq.output_token_ids)).encode()
            self.digests[seq.seq_id] = hashlib.blake2b(tokens, digest_size=8).hexdigest()


def compare_outputs(labels: list[str], docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether every run's per-request output digests equal the first run's: `{"identical": bool,
    "requests": n, "differing": [request ids, at most 10]}`."""
    first = docs[0].get("output_digests") or {}
    differing = sorted({rid for doc in docs[1:] for rid in set(first) | set(doc.get("output_digests") or {})
                        if (doc.get("output_digests") or {}).get(rid) != first.get(rid)})
    return {"identical": not differing, "requests": len(first), "runs": labels, "differing": differing[:10],
            "num_differing": len(differing)}


def mark_documents(docs: list[dict[str, Any]]) -> None:
    """Give each run's document its table cell `outputs`: the first run is the reference, each
    other says whether its outputs are those of the first, request by request."""
    first = docs[0].get("output_digests") or {}
    docs[0]["outputs"] = f"reference ({len(first)})"
    for doc in docs[1:]:
        own = doc.get("output_digests") or {}
        differ = sum(own.get(rid) != first.get(rid) for rid in set(first) | set(own))
        doc["outputs"] = "identical" if not differ else f"{differ} differ"


def format_outputs_check(check: dict[str, Any]) -> str:
    """The line `compare` prints under its table."""
    if check["identical"]:
        return (f"deterministic: every policy produced identical outputs for all {check['requests']} requests "
                f"(the runs differ only in their schedules)\n")
    return (f"deterministic: outputs differ between policies for {check['num_differing']} requests "
            f"(first: {', '.join(check['differing'])})\n")
