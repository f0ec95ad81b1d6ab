"""probes/proc_cross_process.py survives a filter that kills on process_vm_readv/writev.

nsjail's shipped configs KILL_PROCESS on process_vm_readv/writev. The payload once made the
calls in its own process, so the kill ended the probe before it reported (ERROR, "exit 159")
though the sandbox held. The calls now run in a forked child: a child killed by a signal is
a refusal named by the signal, and the payload lives to report it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
from types import ModuleType
from typing import Any

import pytest

from sandbox_attest.catalog.spec import probe_path


def load_payload() -> ModuleType:
    """The payload module itself, as the sandbox runs it."""
    spec = importlib.util.spec_from_file_location("payload_cross", probe_path("proc_cross_process"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class KillingLibc:
    """A libc whose process_vm_* calls die as a KILL_PROCESS seccomp rule makes them die."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Takes what ctypes.CDLL takes, and ignores it."""
        del args, kwargs

    def __getattr__(self, name: str) -> Any:
        """Every function this libc has kills its caller with SIGSYS."""

        def killed(*args: Any) -> int:
            del args
            os.kill(os.getpid(), signal.SIGSYS)
            return -1

        killed.restype = None  # type: ignore[attr-defined]
        killed.argtypes = None  # type: ignore[attr-defined]
        return killed


def test_a_killing_filter_is_a_refusal_named_by_its_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vm call killed by the filter reads as refused with SIGSYS; the payload lives on."""
    payload = load_payload()
    monkeypatch.setattr(payload.ctypes, "CDLL", KillingLibc)
    buf = ctypes.create_string_buffer(16)
    assert payload.vm_call("process_vm_readv", os.getpid(), buf, ctypes.addressof(buf), 16) == (
        -1,
        "SIGSYS",
        b"",
    )
    data, err = payload.vm_read(os.getpid(), ctypes.addressof(buf), 16)
    assert (data, err) == (None, "SIGSYS")


def test_the_own_memory_control_reads_the_bytes_back() -> None:
    """Unfiltered, the control reads the payload's own bytes (through the child's copy)."""
    payload = load_payload()
    own = ctypes.create_string_buffer(b"cross-process-ok")
    data, err = payload.vm_read(os.getpid(), ctypes.addressof(own), 16)
    assert err is None
    assert data == b"cross-process-ok"
