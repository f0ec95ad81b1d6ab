"""Wider-catalogue probes (issue 8), host side: filled in by their own change."""

from __future__ import annotations

from harness.catalog.base import ProbeSpec

SPECS: tuple[ProbeSpec, ...] = ()
