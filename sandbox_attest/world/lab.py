"""The lab: a hermetic network world that looks like the internet (Linux, as root).

`enter_lab(run_dir)` moves this process into network and mount namespaces of its own and
builds, beside them, an "internet" namespace where the fixture hosts live. What it
guarantees, each checked before anything listens (`LabError` otherwise):

1. Nothing changes in the real host's namespaces. This process (from the call on, and every
   child it starts) runs in a new network namespace, the "host side", and a private mount
   namespace. No interface, route, mount or namespace file appears on the real host, and
   everything the lab made goes away with the last process of the run, even under SIGKILL:
   the namespaces are referenced only by this process tree.
2. No route out. The host side has `lo` and one veth, `sa-lab0` (198.18.0.1/30 and
   2001:db8:0:1::1/64), with routes to the internet's hosts (198.19.0.0/24 and
   2001:db8:1::/64) through its peer. The internet side has `lo`, carrying the fixture
   hosts' addresses, and the peer `sa-lab1` (198.18.0.2/30, 2001:db8:0:1::2/64). Neither
   side has a default route or any other interface.
3. The system resolver is the DNS fixture. /etc/resolv.conf (bind-mounted in the private
   mount namespace) names 198.19.0.53, and /etc/hosts is the host's minus every `.test`
   name, so getaddrinfo, curl, pip and a wrapper's own proxy resolve fixture names as they
   would resolve real ones.

To a sandbox, and to a sandbox's own proxy, the fixture hosts are then ordinary remote
hosts: not loopback, not an address of a local interface, not a private range. Every send
to a lab address from harness code passes `sandbox_attest.world.netguard.check_destination`.

What it does not do: confine anything. Sandboxes run inside it as they would on a host, and
a sandbox that gives its payload the host side's network reaches the internet side exactly
as it would reach the internet, which is what the witnesses there are for.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from sandbox_attest.errors import HarnessError
from sandbox_attest.host import disguise, lifetime
from sandbox_attest.world.netguard import current_netns, register_lab_namespaces

if TYPE_CHECKING:
    from collections.abc import Iterator

CLONE_NEWNS: Final = 0x00020000
CLONE_NEWNET: Final = 0x40000000
MS_BIND: Final = 4096
MS_REC: Final = 0x4000
MS_PRIVATE: Final = 1 << 18

HOST_VETH: Final = "sa-lab0"
INTERNET_VETH: Final = "sa-lab1"
HOST_SIDE: Final = "198.18.0.1"  # the host side's own lab address
INTERNET_SIDE: Final = "198.18.0.2"
LINK_PREFIX: Final = 30
HOST_SIDE6: Final = "2001:db8:0:1::1"
INTERNET_SIDE6: Final = "2001:db8:0:1::2"
INTERNET_NET: Final = "198.19.0.0/24"
INTERNET_NET6: Final = "2001:db8:1::/64"
# The fixture hosts, each on an address of the internet side's `lo`.
ORIGIN_ADDRESS: Final = "198.19.0.10"
DNS_ADDRESS: Final = "198.19.0.53"
WITNESS_ADDRESS: Final = "198.19.0.100"
ORIGIN_ADDRESS6: Final = "2001:db8:1::10"
WITNESS_ADDRESS6: Final = "2001:db8:1::100"
INTERNET_ADDRESSES: Final = (ORIGIN_ADDRESS, DNS_ADDRESS, WITNESS_ADDRESS)
INTERNET_ADDRESSES6: Final = (ORIGIN_ADDRESS6, WITNESS_ADDRESS6)
IP_TIMEOUT_S: Final = 10.0


class LabError(HarnessError):
    """The lab could not be made, or does not hold what it guarantees; the run stops."""


@dataclass
class Lab:
    """The running lab. No public constructor: get one from `enter_lab`.

    Attributes:
        host_netns: `net:[inode]` of the host side (this process's namespace now).
        internet_netns: `net:[inode]` of the internet side.
        real_netns: the namespace this process came from (never sent to from here).
        ipv6: whether the IPv6 addresses could be assigned (a kernel with IPv6 off has none).
        setup_s: seconds `enter_lab` took.
    """

    host_netns: str
    internet_netns: str
    real_netns: str
    ipv6: bool
    setup_s: float
    _host_fd: int = field(repr=False)
    _internet_fd: int = field(repr=False)
    _holder_stop: threading.Event = field(repr=False)

    @contextlib.contextmanager
    def internet(self) -> Iterator[None]:
        """Run the block in the internet namespace (this thread only), then come back.

        Sockets created inside stay there: a server bound in the block listens on the
        internet side for its whole life, whichever thread later serves it.
        """
        _setns(self._internet_fd, CLONE_NEWNET)
        try:
            yield
        finally:
            _setns(self._host_fd, CLONE_NEWNET)

    def addresses(self) -> list[str]:
        """Every address the lab assigned that a sandbox could dial, host side included."""
        found = [*INTERNET_ADDRESSES, INTERNET_SIDE, HOST_SIDE]
        if self.ipv6:
            found += [*INTERNET_ADDRESSES6, INTERNET_SIDE6, HOST_SIDE6]
        return found

    def facts(self) -> dict[str, Any]:
        """The lab as the evidence records it (`world`)."""
        return {
            "kind": "lab",
            "reason": "fixture hosts in a network namespace of their own, no route out",
            "host_netns": self.host_netns,
            "internet_netns": self.internet_netns,
            "addresses": self.addresses(),
            "ipv6": self.ipv6,
            "resolver": DNS_ADDRESS,
        }


_current: Lab | None = None
# Why this process runs in the loopback world, once `ensure_lab` decided it.
_loopback_reason = "no lab was asked for (the world was started directly)"

WorldMode = Literal["auto", "lab", "loopback"]


def current_lab() -> Lab | None:
    """The lab this process entered, if any."""
    return _current


def ensure_lab(mode: WorldMode) -> Lab | None:
    """Enter the lab as `mode` asks; call before any thread or child starts.

    Args:
        mode: "auto" enters it where it can be made and records why not elsewhere; "lab"
            requires it; "loopback" never enters it.

    Returns:
        The lab, or None for the loopback world.

    Raises:
        LabError: "lab" was asked and cannot be had (the reason and the fix), or the lab
            was made but does not hold its guarantees (any mode: the run must stop).
    """
    global _loopback_reason  # noqa: PLW0603  (one decision per process)
    if _current is not None:
        return _current
    if mode == "loopback":
        _loopback_reason = "the loopback world was asked for (--world loopback)"
        return None
    ok, why = lab_possible()
    if not ok:
        if mode == "lab":
            raise LabError(f"--world lab: {why}")
        _loopback_reason = why
        return None
    return enter_lab()


def world_fact() -> dict[str, Any]:
    """Where the fixture hosts lived, for the evidence (`world`): the lab, or why not."""
    if _current is not None:
        return _current.facts()
    return {"kind": "loopback", "reason": _loopback_reason}


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise LabError(
            f"{what} failed ({errno.errorcode.get(code, code)}: {os.strerror(code)}); the lab "
            "needs root on Linux (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
        )


def _setns(fd: int, kind: int) -> None:
    _check(_libc().setns(fd, kind), "setns")


def lab_possible() -> tuple[bool, str]:
    """Whether `enter_lab` can work in this process now, and the reason when it cannot."""
    ok, why = lab_supported()
    if not ok:
        return ok, why
    if threading.active_count() != 1:
        others = sorted(
            t.name for t in threading.enumerate() if t is not threading.current_thread()
        )
        return False, (
            "other threads are running, and namespaces are entered per thread "
            f"({len(others)}: {', '.join(others[:5])}{', ...' if len(others) > 5 else ''})"
        )
    return True, ""


def lab_supported() -> tuple[bool, str]:
    """Whether a new harness process could make the lab on this machine (root, Linux, tools).

    What a caller that starts a run in a subprocess asks: its own threads do not matter.
    """
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces are Linux's; this is {sys.platform}"
    if os.geteuid() != 0:
        return False, (
            f"the harness runs as uid {os.geteuid()}, and the lab's namespaces need root; "
            "run as root (sudo) for the lab"
        )
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return False, "ip (iproute2) and nsenter (util-linux) are needed: apt-get install iproute2"
    return True, ""


def _ip(batch: list[str], netns_path: str | None = None) -> None:
    """Run iproute2 commands in one process, in this namespace or the one at `netns_path`."""
    argv = ["ip", "-batch", "-"]
    if netns_path is not None:
        argv = ["nsenter", f"--net={netns_path}", *argv]
    done = subprocess.run(
        argv,
        input="".join(line + "\n" for line in batch),
        capture_output=True,
        text=True,
        timeout=IP_TIMEOUT_S,
        check=False,
        # A harness killed while it builds the lab must not leave ip holding a namespace.
        **lifetime.popen_kwargs(),
    )
    if done.returncode != 0:
        raise LabError(f"setting up the lab failed: ip said {done.stderr.strip()!r}")


def _ip_json(args: list[str], netns_path: str | None = None) -> list[dict[str, Any]]:
    argv = ["ip", "-json", *args]
    if netns_path is not None:
        argv = ["nsenter", f"--net={netns_path}", *argv]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=IP_TIMEOUT_S,
        check=False,
        **lifetime.popen_kwargs(),
    )
    if done.returncode != 0:
        raise LabError(f"could not read the lab's network ({' '.join(args)}): {done.stderr}")
    data = json.loads(done.stdout or "[]")
    return data if isinstance(data, list) else []


def check_no_route_out(netns_path: str | None, interfaces: set[str], where: str) -> None:
    """The namespace has exactly `interfaces` and no default route; else `LabError`."""
    names = {str(link.get("ifname")) for link in _ip_json(["link", "show"], netns_path)}
    if names != interfaces:
        raise LabError(
            f"the lab's {where} has interfaces {sorted(names)}, expected {sorted(interfaces)}: "
            "something else is attached, so the lab is not hermetic; the run stops"
        )
    for family in ("-4", "-6"):
        for route in _ip_json([family, "route", "show", "table", "all"], netns_path):
            if route.get("dst") == "default" and route.get("type", "unicast") == "unicast":
                raise LabError(
                    f"the lab's {where} has a default route ({route}); the lab must have no "
                    "route out, so the run stops"
                )


def _hold_internet_namespace(
    ready: threading.Event, stop: threading.Event, out: dict[str, Any]
) -> None:
    """A thread parked in the internet namespace: iproute2 moves the veth peer to its tid."""
    if _libc().unshare(CLONE_NEWNET) != 0:
        out["error"] = ctypes.get_errno()
        ready.set()
        return
    out["fd"] = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    out["tid"] = threading.get_native_id()
    ready.set()
    stop.wait()


def _resolver_files(run_dir: Path) -> tuple[Path, Path]:
    """resolv.conf naming the DNS fixture, and the host's hosts file minus `.test` names."""
    resolv = run_dir / "resolv.conf"
    resolv.write_text(f"# {disguise.STEM}: local resolver\nnameserver {DNS_ADDRESS}\n")
    hosts = run_dir / "hosts"
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        lines = ["127.0.0.1 localhost", "::1 localhost"]
    kept = [ln for ln in lines if not any(w.endswith(".test") for w in ln.split())]
    hosts.write_text("\n".join(kept) + "\n")
    for path in (resolv, hosts):
        path.chmod(0o644)
    return resolv, hosts


def _bind_over(source: Path, target: Path) -> None:
    if not target.exists():
        raise LabError(f"{target} does not exist, so the lab cannot replace it; create it")
    _check(
        _libc().mount(str(source).encode(), str(target).encode(), None, MS_BIND, None),
        f"bind-mounting {source} over {target}",
    )


def enter_lab() -> Lab:
    """Move this process into the lab (see the module docstring); once per process.

    Returns:
        The lab.

    Raises:
        LabError: the lab cannot be made here (with the reason), or does not hold its
            guarantees (the run must stop: nothing has listened yet).
    """
    global _current  # noqa: PLW0603  (one lab per process, entered once)
    if _current is not None:
        return _current
    ok, why = lab_possible()
    if not ok:
        raise LabError(why)
    start = time.monotonic()
    real = current_netns()
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNET | CLONE_NEWNS), "unshare(CLONE_NEWNET | CLONE_NEWNS)")
    # Mounts made from here on stay in this private namespace, never on the real host.
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    ready, stop = threading.Event(), threading.Event()
    out: dict[str, Any] = {}
    holder = threading.Thread(
        target=_hold_internet_namespace, args=(ready, stop, out), name="lab-internet", daemon=True
    )
    holder.start()
    ready.wait(IP_TIMEOUT_S)
    if "fd" not in out:
        raise LabError(f"could not create the internet namespace ({out.get('error')})")
    internet_path = f"/proc/{os.getpid()}/fd/{out['fd']}"
    _ip(
        [
            "link set lo up",
            f"link add {HOST_VETH} type veth peer name {INTERNET_VETH}",
            f"link set {INTERNET_VETH} netns {out['tid']}",
            f"addr add {HOST_SIDE}/{LINK_PREFIX} dev {HOST_VETH}",
            f"link set {HOST_VETH} up",
            f"route add {INTERNET_NET} via {INTERNET_SIDE}",
        ]
    )
    _ip(
        [
            "link set lo up",
            *(f"addr add {a}/32 dev lo" for a in INTERNET_ADDRESSES),
            f"addr add {INTERNET_SIDE}/{LINK_PREFIX} dev {INTERNET_VETH}",
            f"link set {INTERNET_VETH} up",
        ],
        internet_path,
    )
    ipv6 = _try_ipv6(internet_path)
    check_no_route_out(None, {"lo", HOST_VETH}, "host side")
    check_no_route_out(internet_path, {"lo", INTERNET_VETH}, "internet side")
    # The files are bound, then deleted: a mount holds its inode, and nothing is left in the
    # host's /tmp when the run ends, however it ends.
    with tempfile.TemporaryDirectory(prefix=f"{disguise.STEM}-net-") as tmp:
        Path(tmp).chmod(0o755)
        resolv, hosts = _resolver_files(Path(tmp))
        _bind_over(resolv, Path("/etc/resolv.conf"))
        _bind_over(hosts, Path("/etc/hosts"))
    lab = Lab(
        host_netns=current_netns(),
        internet_netns=str(Path(internet_path).readlink()),
        real_netns=real,
        ipv6=ipv6,
        setup_s=time.monotonic() - start,
        _host_fd=host_fd,
        _internet_fd=int(out["fd"]),
        _holder_stop=stop,
    )
    if lab.host_netns == real:
        raise LabError("the lab's host side is the real host's namespace; the run stops")
    register_lab_namespaces(lab.host_netns, lab.internet_netns)
    _current = lab
    return lab


def _try_ipv6(internet_path: str) -> bool:
    """Assign the IPv6 side; False where the kernel has IPv6 off (the lab is then IPv4 only)."""
    try:
        _ip(
            [
                f"addr add {HOST_SIDE6}/64 dev {HOST_VETH} nodad",
                f"route add {INTERNET_NET6} via {INTERNET_SIDE6}",
            ]
        )
        _ip(
            [
                *(f"addr add {a}/128 dev lo" for a in INTERNET_ADDRESSES6),
                f"addr add {INTERNET_SIDE6}/64 dev {INTERNET_VETH} nodad",
            ],
            internet_path,
        )
    except LabError:
        return False
    return True
