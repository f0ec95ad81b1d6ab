"""The harness tells a good sandbox from a broken one (issue 8, "Discrimination").

A corpus of deliberately weakened sandbox configurations across bubblewrap, docker and the
command wrapper. For each, the probes that match the hole must FAIL, every one of them a probe
its strong configuration PASSes, and every probe unrelated to the hole must give exactly the
strong configuration's verdict (no collateral noise). The strong configurations must give zero
FAIL and zero INCONCLUSIVE in three repeated runs: flakiness is a defect. All cells are real:
real bubblewrap, a real Docker engine, the real running world.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends import create_backend
from sandbox_attest.backends.base import Backend, Identity
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.catalog import PROBES
from sandbox_attest.catalog.net.direct import PROXY_PROBES
from sandbox_attest.paths import matrix_dir
from sandbox_attest.report.evidence import CellEntry
from sandbox_attest.run.matrix import Cell, ProbeRow, load_matrix
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.world.core import World, start_world
from tests.here import cell_here, not_judgeable_here

pytestmark = pytest.mark.slow

SPECS = Path(__file__).parent.parent / "data" / "specs"
IDENTITY = Path(__file__).parent.parent / "data" / "identity"
# The host network: net_proxy_ignored (issue 28) too, because a program that ignores the proxy
# variables then reaches the allowed origin by address, which its access log records (seen
# live on bwrap share-net and docker host-network; the strong legs refuse the connect).
NET_HOLE = frozenset(
    {
        "net_direct_egress",
        "dns_resolution",
        "ipc_unix_socket_escape",
        "net_proxy_env_override",
        "net_loopback_services",
        "net_ipv6_udp_icmp",
        "net_proxy_ignored",
    }
    # Issue 27: every probe of the proxy's checks too (catalog/net/direct.py PROXY_PROBES): the
    # host saw the payload in the harness's network namespace, so what the proxy refused is
    # reachable around it. But net_dns_rebinding, which needs the lab: NOT_APPLICABLE in the
    # loopback world this corpus runs in, on every leg alike.
) | (PROXY_PROBES - {"net_dns_rebinding"})


def bwrap(*weaken: str) -> Callable[[], Backend]:
    """A bubblewrap backend with the named holes."""
    return lambda: BubblewrapBackend(weaken=frozenset(weaken))


def docker(*weaken: str) -> Callable[[], Backend]:
    """A docker backend with the named holes (imported lazily: the SDK is an extra)."""

    def make() -> Backend:
        from sandbox_attest.backends.docker.backend import DockerBackend  # noqa: PLC0415

        return DockerBackend(weaken=frozenset(weaken))

    return make


def spec(name: str) -> Callable[[], Backend]:
    """A command-wrapper backend from a test spec file."""
    return lambda: CommandBackend.from_path(SPECS / f"{name}.toml")


def identity(name: str) -> Callable[[], Backend]:
    """A command-wrapper hole of issue 26 (tests/data/identity/): a host object elsewhere."""
    return lambda: CommandBackend.from_path(IDENTITY / f"{name}.toml")


@dataclass(frozen=True)
class Broken:
    """One weakened configuration, the strong one it weakens, and the probes it must FAIL."""

    id: str
    make: Callable[[], Backend]
    strong: str
    must_fail: frozenset[str]
    why: str


CORPUS = [
    Broken(
        "bwrap-share-net",
        bwrap("share-net"),
        "bubblewrap",
        NET_HOLE,
        "the host network: its listeners, DNS port, loopback services and abstract sockets",
    ),
    Broken(
        "bwrap-host-root-rw",
        bwrap("host-root-rw"),
        "bubblewrap",
        # The host's / brings the host's /run with it: the witness sockets planted beside the
        # real daemons' there hear the payload (docker.sock itself is root:docker 0660); and its
        # /sys/fs/cgroup, where the payload makes a group in the cgroup delegated to it.
        frozenset(
            {
                "fs_write_outside",
                "fs_read_secrets",
                "ipc_unix_socket_escape",
                "proc_kernel_tunables",
            }
        ),
        "the host's / writable: the payload user's canaries change, its ~ is readable",
    ),
    Broken(
        "bwrap-share-pid",
        bwrap("share-pid"),
        "bubblewrap",
        frozenset({"proc_visibility", "lifecycle_orphans", "proc_cross_process"}),
        "the host pid namespace: host processes visible and signalled; setsid children outlive "
        "bwrap",
    ),
    Broken(
        "bwrap-no-die-with-parent",
        bwrap("no-die-with-parent"),
        "bubblewrap",
        frozenset({"lifecycle_orphans"}),
        "the sandbox outlives the harness",
    ),
    Broken(
        "bwrap-pass-env",
        bwrap("pass-env"),
        "bubblewrap",
        frozenset({"env_inheritance"}),
        "the harness's environment (and its planted canary secrets) passed in",
    ),
    Broken(
        "bwrap-no-limits",
        bwrap("no-limits"),
        "bubblewrap",
        frozenset({"resource_limits"}),
        "limits declared but not applied",
    ),
    Broken(
        "bwrap-no-seccomp",
        bwrap("no-seccomp"),
        "bubblewrap",
        frozenset({"proc_syscall_surface", "proc_syscall_surface_extended"}),
        "no syscall filter",
    ),
    Broken(
        "bwrap-keep-caps-allow-userns",
        bwrap("keep-caps", "allow-userns"),
        "bubblewrap",
        frozenset({"proc_privileges", "proc_namespace_escape", "proc_new_mount_api"}),
        "capabilities kept and nested user namespaces allowed: remount reaches the host, and "
        "clone3 and the new mount API work in namespaces of the payload's own",
    ),
    Broken(
        "docker-socket-mounted",
        docker("docker-socket"),
        "docker",
        frozenset({"ipc_unix_socket_escape"}),
        "the Docker socket mounted in",
    ),
    Broken(
        "docker-host-network",
        docker("host-network"),
        "docker",
        NET_HOLE,
        "the host network namespace",
    ),
    Broken(
        "docker-host-pid",
        docker("host-pid"),
        "docker",
        frozenset({"proc_visibility", "proc_cross_process"}),
        "the host pid namespace: host processes visible, read, written and signalled",
    ),
    Broken(
        "wrapper-shared-net",
        spec("hole_generic_shared_net"),
        "bwrap-generic",
        NET_HOLE,
        "a wrapper that shares the host network",
    ),
    Broken(
        "wrapper-docker-socket",
        spec("hole_generic_docker_socket"),
        "bwrap-generic",
        frozenset({"ipc_unix_socket_escape"}),
        "a wrapper that binds a docker-style daemon's socket in",
    ),
    # Issue 26: the host's objects where the probes did not look, found by identity.
    Broken(
        "wrapper-inherited-fds",
        identity("fds_inherited"),
        "bwrap-generic",
        # The descriptors on the host's / and the home are the machinery class's leaked
        # directory descriptors too: the payload reads a canary through them.
        frozenset({"env_inheritance", "fs_leaked_dirfd"}),
        "a wrapper started holding the host's / and the user's home as fds 7 and 8",
    ),
    Broken(
        "wrapper-home-elsewhere",
        identity("mnt_home"),
        "bwrap-generic",
        frozenset({"fs_write_outside", "fs_read_secrets"}),
        "the payload user's home mounted writable at /home/agent",
    ),
    Broken(
        "wrapper-host-tmp-elsewhere",
        identity("mnt_host_tmp"),
        "bwrap-generic",
        frozenset({"fs_write_outside"}),
        "the host's /var/tmp and /dev/shm mounted writable under /host",
    ),
    Broken(
        "wrapper-daemon-socket-elsewhere",
        identity("sock_daemon_elsewhere"),
        "bwrap-generic",
        frozenset({"ipc_unix_socket_escape"}),
        "a host daemon's socket bound at /run/host-docker.sock",
    ),
    Broken(
        "wrapper-run-elsewhere",
        identity("sock_run_elsewhere"),
        "bwrap-generic",
        frozenset({"ipc_unix_socket_escape"}),
        "the host's /run bound read-only at /host/run, its sockets with it",
    ),
    Broken(
        "wrapper-login-session",
        identity("sock_session"),
        "bwrap-generic",
        # The runtime dir is the payload user's own and writable: a write outside the workspace.
        frozenset({"ipc_unix_socket_escape", "fs_write_outside"}),
        "the payload user's login session (/run/user/<uid>) bound in with XDG_RUNTIME_DIR",
    ),
    Broken(
        "wrapper-dev-elsewhere",
        identity("dev_elsewhere"),
        "bwrap-generic",
        # The host's /dev/shm comes with its /dev; dev_access only where a device opens here.
        frozenset({"fs_write_outside"})
        | (frozenset({"dev_access"}) if not_judgeable_here("dev_access") is None else frozenset()),
        "the host's /dev bound at /host/dev beside a minimal /dev",
    ),
]
STRONG: dict[str, Callable[[], Backend]] = {
    "bubblewrap": BubblewrapBackend,
    "docker": docker(),
    "bwrap-generic": lambda: create_backend("bwrap-generic"),
}
# The strong configurations whose every cell must PASS. bwrap-generic is the baseline of the
# wrapper holes only: a spec cannot hand bwrap the seccomp descriptor (matrix/backends note).
CLEAN = ("bubblewrap", "docker")


def probes() -> list[str]:
    """Every probe of the shipped matrix that applies on Linux."""
    rows = load_matrix(matrix_dir() / "matrix.toml").probes
    return [row.id for row in rows if "linux" in row.platforms and row.id in PROBES]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One real running world for the module."""
    started = start_world(tmp_path_factory.mktemp("world"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def control(world: World, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The control leg's results for every probe (every later leg is judged against them)."""
    runner = make_runner(world, tmp_path_factory.mktemp("control"), "none", NoneBackend(), {})
    results = run_all(runner, "none")
    failed = {
        p: e["reason"] for p, e in results.items() if e["verdict"] != "PASS" and not unjudged(p, e)
    }
    assert not failed, f"control leg: {failed}"
    return results


def unjudged(probe: str, entry: Mapping[str, Any]) -> bool:
    """NOT_APPLICABLE for exactly the reason this host or this world gives: not judged here.

    The corpus runs in the loopback world (a lab needs a process with no threads, and pytest
    has them), where net_dns_rebinding and net_metadata_service say they need the lab: a run
    in this world marks them NOT_APPLICABLE on every leg alike, and
    tests/integration/test_real_sandboxes.py judges them in the lab.
    """
    reason = not_judgeable_here(probe) or world_reason(probe)
    return reason is not None and (entry["verdict"], entry["reason"]) == ("NOT_APPLICABLE", reason)


def world_reason(probe: str) -> str | None:
    """Why `probe` does not apply in this (loopback) world on any route, or None.

    Asked with no egress mode, as tests/catalog/test_live.py asks: a reason given then is the
    world's, not a route's (ipc_proxy_socket_tamper's "own" egress reason needs a route).
    """
    inapplicable = getattr(PROBES[probe], "not_applicable", None)
    reason = inapplicable("") if callable(inapplicable) else None
    return None if reason is None else str(reason)


@pytest.fixture(scope="module")
def baselines(
    world: World, control: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, str]]:
    """Each strong configuration's verdicts, run once."""
    found: dict[str, dict[str, str]] = {}
    for name, make in STRONG.items():
        backend = make()
        try:
            runner = make_runner(world, tmp_path_factory.mktemp(name), name, backend, control)
            found[name] = {p: e["verdict"] for p, e in run_all(runner, name).items()}
        finally:
            getattr(backend, "close", lambda: None)()
    return found


def make_runner(
    world: World, scratch: Path, name: str, backend: Backend, control: dict[str, Any]
) -> CellRunner:
    """A runner over one backend (plus the control leg), control results preloaded."""
    every: dict[str, Backend] = {"none": NoneBackend(), name: backend}
    availability = {n: b.availability() for n, b in every.items()}
    assert availability[name].ok, f"{name} UNAVAILABLE here: {availability[name].reason}"
    runner = CellRunner(
        world=world, scratch=scratch, backends=every, availability=availability, platform="linux"
    )
    runner.control_results.update(control)
    return runner


def run_all(runner: CellRunner, backend: str) -> dict[str, CellEntry]:
    """Every probe under `backend`, two cells at a time (each has its own nonce).

    Cells are made as a run on this host makes them (tests/here.py): a probe this machine
    cannot judge is NOT_APPLICABLE with its reason on every leg alike.
    """
    names = probes()
    with ThreadPoolExecutor(2) as pool:
        entries = pool.map(lambda p: runner.run_cell(cell_here(backend, p, 180)), names)
        return dict(zip(names, entries, strict=True))


@pytest.mark.parametrize("broken", CORPUS, ids=[b.id for b in CORPUS])
def test_hole_fails_its_probes_and_nothing_else(
    broken: Broken,
    world: World,
    tmp_path: Path,
    control: dict[str, Any],
    baselines: dict[str, dict[str, str]],
) -> None:
    """The matching probes turn PASS into FAIL; every other probe keeps its strong verdict."""
    strong = baselines[broken.strong]
    assert all(strong[p] == "PASS" for p in broken.must_fail), (
        f"{broken.strong} must PASS {sorted(broken.must_fail)} for the hole to show: {strong}"
    )
    backend = broken.make()
    try:
        runner = make_runner(world, tmp_path, broken.id, backend, control)
        results = run_all(runner, broken.id)
    finally:
        getattr(backend, "close", lambda: None)()
    got = {p: e["verdict"] for p, e in results.items()}
    want = {p: ("FAIL" if p in broken.must_fail else strong[p]) for p in results}
    reasons = {p: e["reason"] for p, e in results.items() if got[p] != want[p]}
    assert got == want, f"{broken.why}: {reasons}"


def unclaimed_reason(probe: str, identity: Identity) -> str | None:
    """Why `probe` is NOT_APPLICABLE to a backend with this identity's claims, if it is."""
    not_claimed = getattr(PROBES[probe], "not_claimed", None)
    return None if not_claimed is None else not_claimed(identity.claims)


def test_corpus_is_wide_enough() -> None:
    """At least twelve holes, across bubblewrap, docker and the command wrapper."""
    assert len(CORPUS) >= 12
    assert {b.strong for b in CORPUS} == set(STRONG)


# Three runs of the whole catalogue (42 probes since issue 28) outlast the default 300 s bound
# on this shared 2-core machine; the bound stays, sized for three rounds.
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("name", CLEAN)
def test_strong_configuration_is_clean_three_times(
    name: str, world: World, tmp_path: Path, control: dict[str, Any]
) -> None:
    """A good configuration gives all PASS, identically, in three repeated runs."""
    backend = STRONG[name]()
    try:
        runner = make_runner(world, tmp_path, name, backend, control)
        rounds = [run_all(runner, name) for _ in range(3)]
        identity = runner.availability[name].identity
    finally:
        getattr(backend, "close", lambda: None)()
    assert identity is not None
    for entries in rounds:
        # PASS, or NOT_APPLICABLE for exactly the reason the backend's claims give (a probe
        # of a claim it does not make, such as protected paths) or this host gives (a probe
        # it cannot judge, tests/here.py): nothing else.
        bad = {
            p: f"{e['verdict']}: {e['reason']}"
            for p, e in entries.items()
            if e["verdict"] != "PASS"
            and not (
                e["verdict"] == "NOT_APPLICABLE" and e["reason"] == unclaimed_reason(p, identity)
            )
            and not unjudged(p, e)
        }
        assert not bad, bad


def test_writable_host_root_is_caught_for_the_payload_user(
    world: World, tmp_path: Path, control: dict[str, Any]
) -> None:
    """The host's / mounted writable lets the container uid change its own canaries: FAIL.

    The container runs as the payload user every backend uses, and the canaries belong to
    that user (its rights on an open host): file modes no longer hide the hole. Before uid
    separation the canaries were root's and this read PASS on EACCES alone.
    """
    backend = docker("host-root-rw")()
    try:
        runner = make_runner(world, tmp_path, "docker-host-root-rw", backend, control)
        entry = runner.run_cell(
            Cell("docker-host-root-rw", ProbeRow("fs_write_outside", 180), None)
        )
    finally:
        getattr(backend, "close", lambda: None)()
    assert entry["verdict"] == "FAIL", entry["reason"]
    via_host = [a for a in entry["attempts"] if "@/host:" in a["what"]]
    assert via_host  # the probe found the mounted host root and tried it
    assert any(a["outcome"] == "succeeded" for a in via_host), via_host
