"""The hook tables of README.md and docs/plugins.md are the one generated from the hookspecs
(`metroline.core.plugins.hook_table`), and every hook signature those documents write in prose
(`` `sample(ctx, seqs, logits, eos_token_id)` ``) is the hookspec's, argument for argument, as
`metroline.api` exports them."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from metroline import api
from metroline.core.plugins import hook_table, hookspecs

ROOT = Path(__file__).parents[1]
CALL = re.compile(r"(?<![\w.])(" + "|".join(api.HOOK_NAMES) + r")\(([^()]*)\)")


def prose(text: str) -> str:
    """`text` without its fenced code blocks (code defines implementations, which may take any
    subset of a hook's arguments, with `self`)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def hookspec_signature(hook: str) -> str:
    return f"{hook}({', '.join(inspect.signature(getattr(hookspecs, hook)).parameters)})"


def test_the_tables_are_the_generated_one():
    assert hook_table.main(["--check"]) == 0
    for doc in hook_table.DOCUMENTS:
        assert f"{hook_table.START}\n{hook_table.table()}\n{hook_table.END}" in (ROOT / doc).read_text()
    rows = hook_table.table().splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == [hookspec_signature(h) for h in hook_table.ordered_hooks()]
    assert sorted(hook_table.ordered_hooks()) == sorted(api.HOOK_NAMES)


@pytest.mark.parametrize("doc", hook_table.DOCUMENTS)
def test_every_hook_signature_in_the_docs_is_the_hookspecs(doc):
    found = []
    for span in re.findall(r"`([^`\n]+)`", prose((ROOT / doc).read_text())):
        for m in CALL.finditer(span):
            if "=" in m.group(2):  # a call (`ctx.hook.estimate_output_tokens(ctx=ctx, seq=seq)`), not a signature
                continue
            found.append(f"{m.group(1)}({m.group(2)})")
    assert set(api.HOOK_NAMES) <= {f.split("(")[0] for f in found}  # the table alone names them all
    wrong = [f for f in found if f != hookspec_signature(f.split("(")[0])]
    assert not wrong, f"{doc}: {wrong} differ from the hookspecs"


def test_a_stale_table_is_found_and_rewritten():
    text = f"intro\n{hook_table.START}\n| `sample(ctx, seqs, logits)` | decision | one token |\n{hook_table.END}\nend\n"
    new = hook_table.rewritten(text, "doc")
    assert new.startswith("intro\n") and new.endswith("\nend\n") and hook_table.table() in new
    with pytest.raises(ValueError, match="needs exactly one"):
        hook_table.rewritten("no markers", "doc")
