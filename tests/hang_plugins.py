"""Plugins that hang for one tenant's requests, for the hook budget's tests (`--plugin
hang_plugins:HangsForAlpha`, with this folder on the server's path)."""

from __future__ import annotations

import time

from metroline.api import hookimpl

AN_HOUR = 3600.0


class HangsForAlpha:
    """`on_arrival` sleeps for an hour on tenant alpha's requests (only the hook budget ends it)."""

    name = "hangs_for_alpha"

    @hookimpl
    def on_arrival(self, seqs):
        if any(s.tenant == "alpha" for s in seqs):
            time.sleep(AN_HOUR)


class SpinsForAlpha:
    """`check_request` loops for an hour (on the CPU, no sleep) on tenant alpha's requests."""

    name = "spins_for_alpha"

    @hookimpl
    def check_request(self, seq):
        if seq.tenant == "alpha":
            end = time.monotonic() + AN_HOUR
            while time.monotonic() < end:
                pass
        return None
