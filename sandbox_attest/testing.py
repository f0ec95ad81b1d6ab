"""Fixtures for a sandbox vendor's own tests: the world, a backend, one judged cell, a proxy.

Loaded by the sandbox-attest pytest plugin (sandbox_attest.plugin registers it), so with the package
installed any test can request them; `pytest --fixtures` lists them. They are the pieces of
a matrix run, one at a time, in the style of pytest-httpserver (`make_x` plus `x`):

    def test_my_sandbox_blocks_direct_egress(attest_cell):
        cell = attest_cell("net_direct_egress", "path/to/my-sandbox.toml")
        assert cell.verdict == "PASS", cell.reason

- `attest_world` (session): the running world (`World`, with `.info`, a `WorldInfo`).
- `attest_backend(name_or_spec)`: a backend by matrix name (`bubblewrap`) or by the path of a
  command-wrapper spec, with its availability (`.ok`, `.reason`).
- `attest_cell(probe, backend)`: runs one probe in the backend, after its control run on the
  unconfined `none` leg (a PASS nobody could have seen fail proves nothing), and returns the
  verdict with its evidence entry.
- `egress_proxy`: the world's own egress proxy; `make_egress_proxy(rules)` starts another
  real proxy process with your allowlist, resolving through the world's DNS fixture.

Nothing here signs anything: a signed attestation comes from `sandbox-attest run` (or
`pytest --sandbox-attest`), which also checks the release policy. The world is the loopback
one unless the process entered the lab (sandbox_attest.world.lab) before the session started.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sandbox_attest.backends import Backend
    from sandbox_attest.backends.base import Availability
    from sandbox_attest.report.evidence import CellEntry
    from sandbox_attest.run.matrix import Matrix
    from sandbox_attest.run.runner import CellRunner
    from sandbox_attest.world.core import World
    from sandbox_attest.world.egress.proxy import ProxyProcess
    from sandbox_attest.world.egress.rules import Rule

# The unconfined leg every PASS is checked against (matrix.toml's [matrix] control).
CONTROL_BACKEND = "none"


@dataclass(frozen=True)
class AttestBackend:
    """A backend and whether it can run here.

    Attributes:
        name: the name cells and evidence use (a spec's `[backend] name`).
        backend: the backend object (`availability()`, `run(ProbeRequest)`).
        availability: what it said when asked: `.ok`, `.reason` (with the fix), `.identity`.
    """

    name: str
    backend: Backend
    availability: Availability

    @property
    def ok(self) -> bool:
        """Whether the backend can start a command here."""
        return self.availability.ok

    @property
    def reason(self) -> str:
        """Why it cannot (empty when it can)."""
        return self.availability.reason or ""


@dataclass(frozen=True)
class CellVerdict:
    """One judged cell.

    Attributes:
        cell_id: `<backend>-<probe>`, as in a matrix run.
        verdict: PASS, FAIL, INCONCLUSIVE, ERROR, UNAVAILABLE or NOT_APPLICABLE.
        reason: why, in a sentence (the broken claim for a FAIL, the fix for UNAVAILABLE).
        evidence: the cell's evidence entry, as evidence.json would hold it.
        control: the control leg's entry for the same probe (None when the cell is the
            control leg itself).
    """

    cell_id: str
    verdict: str
    reason: str
    evidence: CellEntry
    control: CellEntry | None = None

    @property
    def passed(self) -> bool:
        """Whether the verdict is PASS, the only one a release policy accepts."""
        return self.verdict == "PASS"


@dataclass
class CellPool:
    """The session's cell runner, built on first use over the world and the backends asked."""

    world: World
    scratch: Path
    backends: dict[str, AttestBackend] = field(default_factory=dict)
    runner: CellRunner | None = None
    matrix: Matrix | None = None

    def backend(self, name_or_spec: str | os.PathLike[str]) -> AttestBackend:
        """The backend by name or spec path, made and checked for availability once."""
        from sandbox_attest.backends import create_backend, register_spec  # noqa: PLC0415

        key = str(name_or_spec)
        if key.endswith(".toml"):
            # A spec by path: registered under the name inside it, so cells and the
            # evidence say `my-sandbox-net_denied_host`, not a file name.
            key = register_spec(Path(key))
        if key not in self.backends:
            backend = create_backend(key)
            self.backends[key] = AttestBackend(key, backend, backend.availability())
        return self.backends[key]

    def cell(self, probe: str, backend: str | os.PathLike[str] | AttestBackend) -> CellVerdict:
        """One judged cell of `probe` on `backend`, with the control leg's cell beside it."""
        target = backend if isinstance(backend, AttestBackend) else self.backend(backend)
        runner = self._runner()
        control = None
        if target.name != CONTROL_BACKEND:
            control = self._control(probe)
        entry = self._run(runner, probe, target)
        return CellVerdict(
            cell_id=entry["cell_id"],
            verdict=entry["verdict"],
            reason=entry["reason"],
            evidence=entry,
            control=control,
        )

    def _control(self, probe: str) -> CellEntry:
        runner = self._runner()
        if probe not in runner.control_results:
            self._run(runner, probe, self.backend(CONTROL_BACKEND))
        return runner.control_results[probe]

    def _run(self, runner: CellRunner, probe: str, target: AttestBackend) -> CellEntry:
        from sandbox_attest.run.matrix import Cell, current_platform  # noqa: PLC0415

        matrix = self._matrix()
        rows = {row.id: row for row in matrix.probes}
        if probe not in rows:
            from sandbox_attest.errors import ConfigError  # noqa: PLC0415

            raise ConfigError(
                f"attest_cell: probe {probe!r} is not in {matrix.path}; its probes: "
                f"{', '.join(rows)}"
            )
        row = rows[probe]
        listed = {b.name: b for b in matrix.backends}.get(target.name)
        reason = matrix.not_applicable(listed, target.name, row, current_platform())
        runner.backends[target.name] = target.backend
        runner.availability[target.name] = target.availability
        from sandbox_attest.run.runner import applicable_here  # noqa: PLC0415

        return runner.run_cell(applicable_here(Cell(target.name, row, reason)))

    def _matrix(self) -> Matrix:
        if self.matrix is None:
            from sandbox_attest.paths import default_matrix  # noqa: PLC0415
            from sandbox_attest.run.matrix import load_matrix  # noqa: PLC0415

            self.matrix = load_matrix(default_matrix())
        return self.matrix

    def _runner(self) -> CellRunner:
        if self.runner is None:
            from sandbox_attest.host.trust import payload_user  # noqa: PLC0415
            from sandbox_attest.run.matrix import current_platform  # noqa: PLC0415
            from sandbox_attest.run.runner import CellRunner  # noqa: PLC0415

            user = payload_user()
            if user is not None:
                # As in a matrix run (run.session): what the payload user must read is
                # made by this process, so a 077 umask would make every cell measure modes.
                os.umask(0o022)
            self.runner = CellRunner(
                world=self.world,
                scratch=self.scratch,
                backends={},
                availability={},
                platform=current_platform(),
                control_leg=CONTROL_BACKEND,
                user=user,
            )
        return self.runner


def parse_rule(rule: str | Rule, *, allow_private: bool) -> Rule:
    """A proxy rule from `"host:port[,port]"` or `"*.suffix:port"` (or a `Rule` as it is).

    Args:
        rule: the rule; without a port it admits 80 and 443.
        allow_private: whether the host may resolve to a loopback or private address.

    Raises:
        ConfigError: the port is not a number (the message shows the rule and the form).
    """
    from sandbox_attest.errors import ConfigError  # noqa: PLC0415
    from sandbox_attest.world.egress.rules import Rule  # noqa: PLC0415

    if isinstance(rule, Rule):
        return rule
    host, _, ports = rule.partition(":")
    suffix = host.startswith("*.")
    try:
        numbers = tuple(int(p) for p in ports.split(",")) if ports else (80, 443)
    except ValueError:
        raise ConfigError(
            f"make_egress_proxy: rule {rule!r} has a port that is not a number; write "
            "'host:443', 'host:80,443' or '*.suffix:443'"
        ) from None
    return Rule(
        host=host.removeprefix("*.").lower(),
        suffix=suffix,
        ports=numbers,
        allow_private=allow_private,
    )


@pytest.fixture(scope="session")
def attest_world() -> Iterator[World]:
    """The running world for this session: fake origins, DNS, proxy, witnesses.

    `attest_world.info` is its `WorldInfo` (hosts, ports, the CA bundle, the proxy's socket);
    `attest_world.records(nonce)` is what every witness saw for one nonce. Stopped, and its
    files removed, at the end of the session.
    """
    from sandbox_attest.world.core import start_world  # noqa: PLC0415
    from sandbox_attest.world.lab import current_lab  # noqa: PLC0415

    # Short and under /tmp: unix socket paths are limited to about 100 bytes, and the payload
    # user must traverse the directory (0755), as in a matrix run.
    scratch = Path(tempfile.mkdtemp(prefix="sa-fixt-"))
    scratch.chmod(0o755)
    try:
        with start_world(scratch / "world", lab=current_lab()) as world:
            yield world
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def attest_cell_pool(attest_world: World) -> CellPool:
    """The session's cell runner (private: use `attest_cell` and `attest_backend`)."""
    scratch = Path(attest_world.info.run_dir).parent / "cells"
    scratch.mkdir(mode=0o755)
    return CellPool(world=attest_world, scratch=scratch)


@pytest.fixture(scope="session")
def attest_backend(attest_cell_pool: CellPool) -> Callable[[str | os.PathLike[str]], AttestBackend]:
    """Make a backend: `attest_backend("bubblewrap")` or `attest_backend("my-sandbox.toml")`.

    Returns an `AttestBackend` with `.ok` and `.reason`; it never skips by itself, so a test
    decides whether an unavailable backend fails it. One object per name per session.
    """
    return attest_cell_pool.backend


@pytest.fixture(scope="session")
def attest_cell(
    attest_cell_pool: CellPool,
) -> Callable[[str, str | os.PathLike[str] | AttestBackend], CellVerdict]:
    """Run one probe: `attest_cell("net_denied_host", "bubblewrap")` returns a `CellVerdict`.

    The probe first runs on the unconfined control leg (once per session and probe), as in
    a matrix run: a PASS whose control did not see the escape is INCONCLUSIVE. The backend is
    a name, a spec path, or an `attest_backend(...)` result.
    """
    return attest_cell_pool.cell


@pytest.fixture(scope="session")
def egress_proxy(attest_world: World) -> ProxyProcess:
    """The world's own egress proxy: `.url`, `.socket`, `.decisions()`.

    Its allowlist admits the world's allowed hosts only; it is the proxy every cell
    of `attest_cell` reaches. Stopped with the world.
    """
    return attest_world.proxy


@pytest.fixture
def make_egress_proxy(attest_world: World) -> Iterator[Callable[..., ProxyProcess]]:
    """Start a real proxy process: `make_egress_proxy(["allowed.test:443", "*.pkg.test"])`.

    It resolves through the world's DNS fixture. Rules are strings or `Rule`s; by default
    a rule may resolve to a private address only in the loopback world, where the fixture
    hosts live on 127.0.0.1 (`allow_private=` overrides). Stopped at the test's end.
    """
    from sandbox_attest.world.egress.config import ProxyConfig  # noqa: PLC0415
    from sandbox_attest.world.egress.proxy import start_proxy  # noqa: PLC0415
    from sandbox_attest.world.lab import INTERNET_NET, INTERNET_NET6  # noqa: PLC0415

    lab = attest_world.lab
    started: list[ProxyProcess] = []
    scratch = Path(tempfile.mkdtemp(prefix="sa-proxy-"))

    def make(rules: list[str | Rule], *, allow_private: bool | None = None) -> ProxyProcess:
        private = lab is None if allow_private is None else allow_private
        config = ProxyConfig(
            rules=tuple(parse_rule(r, allow_private=private) for r in rules),
            dns=(attest_world.dns.host, attest_world.dns.port),
            unix_socket=scratch / f"p{len(started)}.sock",
            tcp=True,
            decision_log=scratch / f"p{len(started)}.jsonl",
            # In the lab the fixture hosts are remote, reached from the lab's host side only
            # (sandbox_attest/world/netguard.py), exactly as the world's own proxy reaches them.
            remote_networks=(INTERNET_NET, INTERNET_NET6) if lab is not None else (),
            lab_namespaces=(lab.host_netns,) if lab is not None else (),
        )
        proxy = start_proxy(config)
        started.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in started:
            proxy.stop()
        shutil.rmtree(scratch, ignore_errors=True)
