"""The markers of metroline's hooks: `hookspec` declares one (in `metroline.core.plugins.hookspecs`),
`hookimpl` marks a plugin's implementation of one (`@hookimpl`, `@hookimpl(wrapper=True)`)."""

from __future__ import annotations

import pluggy

PROJECT = "metroline"
"""pluggy's project name of metroline's hooks (the markers' attribute is `metroline_impl`)."""
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
