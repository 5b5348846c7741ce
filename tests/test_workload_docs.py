"""docs/workloads.md: its example spec loads, and each tenant's lengths follow its own
distributions; per-tenant length tables are validated; specs without them draw what they drew."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from metroline.core.workloads.build import SyntheticSpec, generate, load_spec
from metroline.core.workloads.items import WorkloadError
from metroline.core.workloads.specs import FixedLength, LognormalLength, TenantSpec, UniformLength

DOC = Path(__file__).resolve().parent.parent / "docs" / "workloads.md"


def doc_example(tmp_path) -> Path:
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, "the doc has one complete example"
    path = tmp_path / "tiers.toml"
    path.write_text(blocks[0])
    return path


def mean_and_sd(dist) -> tuple[float, float]:
    """The mean and standard deviation of a length distribution (the lognormal's before rounding
    and clipping)."""
    if isinstance(dist, FixedLength):
        return dist.value, 0.0
    if isinstance(dist, UniformLength):
        width = dist.high - dist.low + 1
        return (dist.low + dist.high) / 2, math.sqrt((width * width - 1) / 12)
    assert isinstance(dist, LognormalLength)
    return dist.mean, dist.mean * math.sqrt(math.exp(dist.sigma**2) - 1)


def test_the_doc_example_draws_each_tenants_lengths_from_its_own_distributions(tmp_path):
    spec = load_spec(doc_example(tmp_path))
    assert any(isinstance(t, TenantSpec) for t in spec.tenants.values())
    items = generate(spec, namespace="doc-example")
    assert len(items) == spec.num_requests
    for tenant in spec.tenants:
        mine = [it for it in items if it.tenant == tenant]
        n = len(mine)
        share = spec.tenants[tenant] if isinstance(spec.tenants[tenant], float) else spec.tenants[tenant].share
        # the tenant's count is binomial(num_requests, share): within 5 standard deviations
        assert abs(n - spec.num_requests * share) <= 5 * math.sqrt(spec.num_requests * share * (1 - share))
        prompt_dist, output_dist = spec.lengths_of(tenant)
        assert all(it.segments[0][1] == spec.shared_prefix_len for it in mine)
        for dist, values in ((prompt_dist, [it.segments[-1][1] for it in mine]),
                             (output_dist, [it.output_len for it in mine])):
            mean, sd = mean_and_sd(dist)
            # 5 standard errors of a mean of n draws, plus half a token for the lognormal's rounding
            tolerance = 5 * sd / math.sqrt(n) + (0.5 if isinstance(dist, LognormalLength) else 0.0)
            assert abs(sum(values) / n - mean) <= tolerance, (tenant, dist)


def test_tenants_without_their_own_lengths_draw_the_specs(tmp_path):
    spec = load_spec(doc_example(tmp_path))
    assert spec.lengths_of("free") == (spec.prompt_len, spec.output_len)
    team_prompt, team_output = spec.lengths_of("team")
    assert team_prompt == spec.prompt_len and team_output == FixedLength(value=64)


def test_a_share_table_without_lengths_draws_what_the_bare_share_drew():
    base = dict(num_requests=300, rate=10.0, prompt_len={"dist": "uniform", "low": 1, "high": 500},
                output_len={"dist": "lognormal", "mean": 50, "sigma": 1.0})
    plain = SyntheticSpec(**base, tenants={"a": 3, "b": 1})
    table = SyntheticSpec(**base, tenants={"a": {"share": 3}, "b": 1})
    assert generate(plain, namespace="same") == generate(table, namespace="same")
    assert table.tenants["a"].share == plain.tenants["a"] == 0.75  # normalised alike


@pytest.mark.parametrize("tenant, error", [
    ("share = -1", "tenants.x.share: Input should be greater than or equal to 0"),
    ("share = 1\nprompt_len = { dist = \"uniform\", low = 0, high = 3 }",
     "tenants.x.prompt_len.low: Input should be greater than or equal to 1"),
    ("share = 1\noutput_len = { dist = \"lognormal\", mean = 10, sigma = 11 }",
     "tenants.x.output_len.sigma: Input should be less than or equal to 10"),
    ("share = 1\nprompt = 5", "tenants.x.prompt: Extra inputs are not permitted"),
    ("prompt_len = 5", "tenants.x.share: Field required"),
])
def test_tenant_tables_are_validated_naming_the_key_and_the_limit(tmp_path, tenant, error):
    path = tmp_path / "bad.toml"
    path.write_text(f"num_requests = 3\nprompt_len = 1\noutput_len = 1\n[tenants.x]\n{tenant}\n")
    with pytest.raises(WorkloadError) as info:
        load_spec(path)
    assert f"bad.toml: invalid workload spec:\n  {error}" in str(info.value)
