"""Building blocks for platform teams: plugins that stack on a base policy (or are one).

- `tenant_quota` (`TenantQuota`): per-tenant caps on running requests and token buckets
  (tokens/s); an admission wrapper that drops over-quota tenants' candidates from any base
  policy's answer. `--policy fcfs --plugin tenant_quota`
- `prefix_aware` (`PrefixAware`): a base policy: longest-prefix-match admission (SGLang's LPM)
  over a window of the oldest waiting requests, with aging so that requests with nothing cached
  are overtaken only by requests that arrived less than (cache hit / aging_rate) seconds later.
  `--policy prefix_aware`
- `slo_classes` (`SLOClasses`): interactive and batch classes (by tenant or priority);
  interactive decodes are served first within a reserved share of the budget, interactive
  requests are admitted first and never preempted while a batch request runs; wrappers, so it
  stacks on any policy. `--policy fcfs --plugin slo_classes`
- `tenant_shares` (`TenantShares`): a reserved share of every step's decode and prefill tokens
  per tenant (`Split.shares`), served first, what a tenant leaves unused going to the others;
  a `split_budget` wrapper, so it stacks on any policy.
  `--policy fcfs --plugin tenant_shares`
- `least_computed` (`LeastComputed`), `residual_sjf` (`ResidualSJF`), `session_affinity`
  (`SessionAffinity`): policies the vLLM community proposed (least-computed-first victim,
  residual-aware SJF with aging, bounded session affinity), each a module of a few dozen lines;
  docs/guide/community-policies.md compares each with its baseline on real traces.
- `structured_output` (`StructuredOutputSampler`): a request's output held to a JSON schema (or
  any JSON object) by llguidance's grammar on the model's logits, a `sample` wrapper around any
  sampler. Not shipped by name: the torch executor brings it, built with its tokenizer
  (`TorchExecutor.plugins()`); the server fills it from OpenAI's `response_format`.

All but `structured_output` are registered by name in `metroline.core.plugins.manager.SHIPPED`; options go in the config file's
`[plugin_options.NAME]` table and are declared by each class's `Options` model (`metroline
plugins` lists them). See each class's docstring and docs/contrib.md.
"""
