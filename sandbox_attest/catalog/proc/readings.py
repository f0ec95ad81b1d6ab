"""The host's readings of the payload's processes (run/hostview.py), in words.

Each takes the judged processes of a cell (`sandbox_attest.catalog.spec.host_processes`) and
says what the host saw on them that a report cannot rewrite: a namespace shared with the
harness, NoNewPrivs unset, effective capabilities, seccomp filters.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = [
    "named_process",
    "seccomp_filter_count",
    "sharing_with_harness",
    "with_capabilities",
    "without_no_new_privs",
]


def named_process(process: dict[str, Any]) -> str:
    """A host reading's process in words: "host pid 123 (python3)"."""
    comm = process.get("comm")
    return f"host pid {process.get('pid', '?')}" + (f" ({comm})" if comm else "")


def sharing_with_harness(processes: list[dict[str, Any]], kind: str) -> str:
    """The judged processes the host saw in the harness's own `kind` namespace, or ""."""
    return ", ".join(
        named_process(p) for p in processes if kind in (p.get("shared_with_harness") or [])
    )


def without_no_new_privs(processes: list[dict[str, Any]]) -> str:
    """The judged processes whose status the host read with NoNewPrivs unset, or ""."""
    return ", ".join(
        f"{named_process(p)} NoNewPrivs={(p.get('status') or {}).get('NoNewPrivs')}"
        for p in processes
        if (p.get("status") or {}) and (p.get("status") or {}).get("NoNewPrivs") != "1"
    )


def with_capabilities(processes: list[dict[str, Any]]) -> str:
    """The payload processes the host saw holding effective capabilities, in words; or ""."""
    held = []
    for process in processes:
        cap_eff = str((process.get("status") or {}).get("CapEff", ""))
        with contextlib.suppress(ValueError):
            if int(cap_eff, 16):
                held.append(f"{named_process(process)} CapEff={cap_eff}")
    return ", ".join(held)


def seccomp_filter_count(status: dict[str, Any]) -> int:
    """How many seccomp filters the host sees on a process (mode 2 only); 0 without any."""
    if str(status.get("Seccomp")) != "2":
        return 0
    try:
        return int(str(status.get("Seccomp_filters", "1")))
    except ValueError:
        return 1
