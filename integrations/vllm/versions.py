"""The vLLM versions the bridge is written against, checked when the scheduler starts."""

from __future__ import annotations

SUPPORTED_VLLM = ((0, 32), (0, 34))
"""vLLM versions `>= 0.32, < 0.34`: the scheduler seams the bridge uses (the waiting queue's
`RequestQueue` interface, the running list, the victim choice of the priority policy,
`_preempt_request`) are those of 0.32 and 0.33."""

FIRST_TO_GO_ON_AFTER_SELF_VICTIM = (0, 33)
"""The first vLLM version whose step, under the priority policy's victim choice (the bridge's), goes
on with the running requests after one preempted as its own victim (0.32's stops its running phase
there, for the step)."""


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as `0.32.0`, `0.33.1rc1` or `0.32.0+cpu`."""
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        raise RuntimeError(f"metroline.integrations.vllm: cannot read vLLM's version {text!r}") from None


def check_vllm_version(version: str | None = None) -> str:
    """Raise `RuntimeError` unless vLLM's version (the installed one by default) is supported;
    returns it."""
    if version is None:
        import vllm

        version = vllm.__version__
    low, high = SUPPORTED_VLLM
    if not low <= parse_version(version) < high:
        raise RuntimeError(
            f"metroline.integrations.vllm supports vLLM >= {low[0]}.{low[1]}, < {high[0]}.{high[1]}; "
            f"vLLM {version} is installed"
        )
    return version
