"""The harness's own processes under neutral titles: what `ps` and /proc show other users.

procfs is world-readable unless it is mounted with `hidepid`: a wrapper running as the payload
user reads every process's /proc/<pid>/cmdline, comm and stat. The harness (the
`sandbox-attest` console script, `python -m sandbox_attest.cli`, or pytest with
`--sandbox-attest`), the egress proxy (`python -m sandbox_attest.world.egress.proxy CONFIG`) and the
signer (`python -P -m sandbox_attest.attest.signer`) would name themselves there, and the
harness is every wrapper's parent. A wrapper that confines only when it sees one would earn
every PASS (issue 23), so each sets a neutral title as it starts.

How, on Linux: `prctl(PR_SET_NAME)` sets the calling thread's `comm` (what /proc/<pid>/comm,
stat and status show, at most 15 bytes), and the argument area the kernel reads
/proc/<pid>/cmdline from is overwritten in place, NUL-padded to its old length. Its address is
in /proc/self/stat (fields 48 and 49, since Linux 3.5). CPython copied its argv into its own
objects at start-up (`sys.argv`, `sys.orig_argv`), so nothing reads that memory again. A title
longer than the old command line is cut to fit; the kernel keeps the area's size.

What remains visible is listed in reports/README.md ("What a wrapper can still see"): the
process's uid (root), start time, its cgroup, its children, the sockets it listens on
(/proc/net), the comm of any thread started before the title was set, and the command line of
whatever started the harness (a shell or CI step that typed `sandbox-attest run`). Its environ,
exe, cwd, maps and fd are readable only with ptrace access, which another uid does not have.

Stdlib only: the egress proxy's own process imports it. Elsewhere than Linux it does nothing
and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Retitled", "harness_title", "proxy_title", "set_title", "signer_title"]

# <linux/prctl.h>
PR_SET_NAME: Final = 15
PR_SET_MM: Final = 35
PR_SET_MM_ARG_END: Final = 9
# The kernel keeps TASK_COMM_LEN (16) bytes of comm, its NUL included.
COMM_MAX: Final = 15
# Fields 48 and 49 of /proc/<pid>/stat (1-based): where the argument area starts and ends.
ARG_START_FIELD: Final = 48
ARG_END_FIELD: Final = 49
# The module name the proxy shows in its title, which the sweep recognises an orphan by
# (sandbox_attest/run/sweep.py PROXY_MODULES).
PROXY_MODULE_TITLE: Final = "relay"

_retitled: list[Retitled] = []


@dataclass(frozen=True)
class Retitled:
    """What the process shows now, read back from /proc, and what could not be done."""

    comm: str
    cmdline: list[str]
    notes: list[str] = field(default_factory=list)


def _interpreter_name() -> str:
    """The interpreter's file name (`python3.11`): how any Python program's title begins."""
    return Path(sys.executable).name or "python3"


def harness_title() -> list[str]:
    """The title of the harness process: an ordinary Python program."""
    return [_interpreter_name(), "app.py"]


def proxy_title(config: str) -> list[str]:
    """The egress proxy's title: the sweep's shape (`PYTHON -m MODULE CONFIG`), neutral words.

    The config path is a `proxy-config-*.json` temp file, already removed once the proxy is
    up; it keeps the title's shape, by which an orphaned proxy is found and killed.
    """
    return [_interpreter_name(), "-m", PROXY_MODULE_TITLE, config]


def signer_title() -> list[str]:
    """The signer's title."""
    return [_interpreter_name(), "worker.py"]


def _stat_fields() -> list[str]:
    """/proc/self/stat split after the comm (which may hold spaces): index 0 is field 3."""
    raw = Path("/proc/self/stat").read_text()
    return raw.rsplit(")", 1)[1].split()


def _arg_area() -> tuple[int, int]:
    """The start and end address of this process's argument area.

    Raises:
        OSError: /proc/self/stat cannot be read, or it hides the addresses (shown as 0).
    """
    fields = _stat_fields()
    try:
        start = int(fields[ARG_START_FIELD - 3])
        end = int(fields[ARG_END_FIELD - 3])
    except (IndexError, ValueError) as exc:
        msg = f"/proc/self/stat has no argument-area fields (kernel older than 3.5?): {exc}"
        raise OSError(msg) from exc
    if start == 0 or end <= start:
        msg = f"/proc/self/stat shows no argument area ({start}..{end})"
        raise OSError(msg)
    return start, end


def _read_back() -> tuple[str, list[str]]:
    comm = Path("/proc/self/comm").read_text().rstrip("\n")
    words = Path("/proc/self/cmdline").read_bytes().split(b"\0")
    while words and not words[-1]:
        words.pop()
    return comm, [w.decode("utf-8", "replace") for w in words]


def set_title(title: Sequence[str]) -> Retitled:
    """Show `title` as this process's command line and its first word's name as its comm.

    Call it from the main thread, before any other thread starts: comm is per thread, and a
    thread copies its creator's name when it is made.

    Args:
        title: the words of the new command line (none may contain a NUL).

    Returns:
        What /proc shows afterwards, with a note for each part that could not be set. Never
        raises for a part that failed: a title is a courtesy of the kernel, not a guarantee,
        and the run goes on either way (the README says what a wrapper may still see).
    """
    if not sys.platform.startswith("linux"):
        return Retitled(comm="", cmdline=[], notes=[f"no process titles on {sys.platform}"])
    if not title or any("\0" in word for word in title):
        msg = f"a title is one or more words without NUL bytes, not {list(title)!r}"
        raise ValueError(msg)
    notes: list[str] = []
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    name = Path(title[0]).name.encode()[:COMM_MAX]
    if libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0) != 0:
        notes.append(f"prctl(PR_SET_NAME) failed: errno {ctypes.get_errno()}")
    try:
        start, end = _arg_area()
    except OSError as exc:
        notes.append(f"the command line was left as it was: {exc}")
    else:
        size = end - start
        wanted = "\0".join(title).encode()
        # The last byte stays NUL: with it the kernel shows exactly [start, end), without it
        # it would read on into the environment area as setproctitle(3)'s convention.
        shown = wanted[: size - 1]
        if len(shown) < len(wanted):
            notes.append(f"the title was cut to the old command line's {size} bytes")
        buffer = ctypes.create_string_buffer(shown.ljust(size, b"\0"), size)
        ctypes.memmove(start, buffer, size)
        # With CAP_SYS_RESOURCE (the harness as root) the area itself shrinks to the title,
        # so the command line ends where the title does instead of in a run of NULs that
        # no program's command line has. Without it, the padding stays and is said.
        new_end = ctypes.c_ulong(start + len(shown) + 1)
        if libc.prctl(PR_SET_MM, PR_SET_MM_ARG_END, new_end, 0, 0) != 0:
            notes.append(
                f"the command line keeps {size - len(shown) - 1} NUL bytes of padding "
                f"(prctl(PR_SET_MM_ARG_END) failed: errno {ctypes.get_errno()})"
            )
    comm, cmdline = _read_back()
    done = Retitled(comm=comm, cmdline=cmdline, notes=notes)
    _retitled.append(done)
    return done


def retitled() -> bool:
    """Whether this process has set a title already (the CLI before the plugin's turn)."""
    return bool(_retitled)
