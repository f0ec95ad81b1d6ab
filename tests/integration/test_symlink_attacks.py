"""Issue 23's attack, live: a wrapper re-points the payload home's dirs at a root directory.

The wrapper (tests/data/symlink_attacker/wrapper.py) runs as the payload user, replaces
`~/.ssh` (fs_read_secrets' canaries) and `~/.config` (a canary class of fs_write_outside) with
symlinks to a root-owned directory of this test's making (a stand-in for /etc/cron.hourly),
and leaves a helper that swaps whatever lands there and re-points the links so a cleanup that
follows the path again misses it. A harness that follows those paths as root creates a file
in the decoy and hands it to the payload user: root on the runner, with a real cron dir.

Two runs: "plant" (the links are in place before the harness first looks) and "race" (the
harness first finds plain dirs; the helper flips them to the links and back every few ms and
swaps the canaries it finds for links into the decoy, racing every check-then-use).

Done means: nothing is created or chowned in the decoy, no fs_read_secrets cell is PASS (nor,
with the links planted, any fs_write_outside cell), the gate is never PASSED, and a reason
names the symlink.

The run uses a payload account of its own ($SANDBOX_ATTEST_PAYLOAD_USER): the attack wrecks
that account's home, and other runs on this machine (which share the default account) must
not see it. Real processes, real uids; root only.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.attest import EVIDENCE_NAME
from sandbox_attest.attest.keys import ENV_VAR
from sandbox_attest.host.trust import USER_ENV
from tests.integration.test_cli_run import CLI, keypair

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="uid separation needs root; the non-root harness variant is not written",
    ),
    pytest.mark.timeout(240),
]

REPO = Path(__file__).parent.parent.parent
ATTACKER = Path(__file__).parent.parent / "data" / "symlink_attacker"
PROBES = ("fs_read_secrets", "fs_write_outside")
BACKEND = "symlinker"
# This test's own payload account, with its home under a root-owned 0755 parent (the layout
# the harness requires of the default account too: sandbox_attest/host/trust.py).
ACCOUNT = "sa-symlink-test"
ACCOUNT_BASE = Path("/var/lib/sandbox-attest-symlink-test")
ACCOUNT_HOME = ACCOUNT_BASE / "home"
LINKED = (".ssh", ".config")  # what the wrapper re-points
HELPER_BOUND_S = 90
HELPER_STOP_WAIT_S = 5.0
RUN_TIMEOUT_S = 180


def ensure_account() -> None:
    """The test's payload account exists, its home a plain dir with none of the attack's traces.

    Idempotent: a previous run of this test may have left the account (accounts are kept, as
    the default one is) and, if it died, the wrapper's links in the home.
    """
    ACCOUNT_BASE.mkdir(mode=0o755, exist_ok=True)
    ACCOUNT_BASE.chmod(0o755)
    try:
        pwd.getpwnam(ACCOUNT)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        argv = [useradd, "--system", "--user-group", "--home-dir", str(ACCOUNT_HOME)]
        argv += ["--create-home", "--shell", "/bin/sh", ACCOUNT]
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert done.returncode in (0, 9), done.stderr
    scrub_home()


def scrub_home() -> None:
    """Remove the wrapper's links and dirs from the test account's home (never followed)."""
    if not ACCOUNT_HOME.is_dir() or ACCOUNT_HOME.is_symlink():
        return
    for entry in ACCOUNT_HOME.iterdir():
        if entry.name in LINKED or ".attacker" in entry.name:
            if entry.is_symlink() or not entry.is_dir():
                entry.unlink()
            else:
                shutil.rmtree(entry)  # fd-based on Linux: never follows a link inside


@dataclass(frozen=True)
class AttackRun:
    """One attacked `sandbox-attest run` and what it left."""

    mode: str  # "plant" or "race" (tests/data/symlink_attacker/wrapper.py)
    root: Path
    drop: Path
    decoy: Path
    out: Path
    returncode: int
    stdout: str
    stderr: str

    def records(self, attack: str | None = None) -> list[dict[str, Any]]:
        """The wrapper's result lines (of one attack); fails when the wrapper left none."""
        path = self.drop / "attacks.jsonl"
        assert path.is_file(), (
            f"the wrapper left no {path}: it never ran, so nothing was attacked "
            f"(stdout tail: {self.stdout[-2000:]!r}, stderr: {self.stderr[-1000:]!r})"
        )
        lines = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        return [r for r in lines if attack is None or r["attack"] == attack]

    def cells(self) -> dict[str, dict[str, Any]]:
        """The evidence's cells by id."""
        evidence = json.loads((self.out / EVIDENCE_NAME).read_bytes())
        return {c["cell_id"]: c for c in evidence["cells"]}


def stop_helper(drop: Path, wrapper: Path) -> None:
    """Make the helper stop (stop file); SIGKILL it by its own recorded pid if it does not."""
    (drop / "stop").touch()
    records = drop / "attacks.jsonl"
    deadline = time.monotonic() + HELPER_STOP_WAIT_S
    while time.monotonic() < deadline:
        if records.is_file() and '"helper-done"' in records.read_text():
            return
        time.sleep(0.05)
    if not records.is_file():
        return
    for line in records.read_text().splitlines():
        entry = json.loads(line)
        if entry["attack"] != "helper-start":
            continue
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{entry['pid']}/cmdline").read_bytes()
            if str(wrapper).encode() in cmdline and b"--helper" in cmdline:
                os.kill(entry["pid"], signal.SIGKILL)


def attack(root: Path, mode: str) -> AttackRun:
    """Run `sandbox-attest run` with the symlinker named, as the test's own payload account."""
    ensure_account()
    drop = root / "drop"
    drop.mkdir()
    drop.chmod(0o777)  # the payload user records there; nothing of the harness lives there
    decoy = root / "decoy-cron.hourly"  # root's, 0755: what /etc/cron.hourly is
    decoy.mkdir()
    decoy.chmod(0o755)
    wrapper = root / "wrapper.py"
    shutil.copyfile(ATTACKER / "wrapper.py", wrapper)
    wrapper.chmod(0o755)
    text = (ATTACKER / "spec.toml.in").read_text()
    for token, value in (
        ("@WRAPPER@", str(wrapper)),
        ("@DROP_DIR@", str(drop)),
        ("@DECOY@", str(decoy)),
        ("@HELPER_SECONDS@", str(HELPER_BOUND_S)),
        ("@MODE@", mode),
    ):
        text = text.replace(token, value)
    spec = root / "symlinker.toml"
    spec.write_text(text)
    matrix = root / "matrix.toml"
    matrix.write_text(
        "".join(f'[[probe]]\nid = "{p}"\ntimeout = 30\n' for p in PROBES)
        + '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
    )
    policy = root / "policy.toml"
    probes = ", ".join(f'"{p}"' for p in PROBES)
    policy.write_text(f'[[require]]\nplatform = "linux"\nbackend = "none"\nprobes = [{probes}]\n')
    private, _ = keypair(root)
    out = root / "report"
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR} | {USER_ENV: ACCOUNT}
    argv = [*CLI, "run", "--matrix", str(matrix), "--policy", str(policy)]
    argv += ["--backend-spec", str(spec), "--out", str(out), "-j", "2", "--key", str(private)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        stop_helper(drop, wrapper)
    return AttackRun(mode, root, drop, decoy, out, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module", params=["plant", "race"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One attacked run per mode, shared by the checks below; the account's home scrubbed after."""
    mode = str(request.param)
    try:
        yield attack(tmp_path_factory.mktemp(f"symlink-{mode}"), mode)
    finally:
        scrub_home()


def test_the_wrapper_attacked_this_run(run: AttackRun) -> None:
    """The wrapper ran as the test's account; it planted both links, or its helpers raced."""
    uid = pwd.getpwnam(ACCOUNT).pw_uid
    assert run.records("exec"), "the wrapper never ran: nothing was attacked"
    assert {r["uid"] for r in run.records()} == {uid}
    assert run.records("helper-start"), "no helper ever started"
    if run.mode == "plant":
        links = run.records("links")
        assert any(all(v == "ok" for v in r["results"].values()) for r in links), links
    else:
        repointed = run.records("repointed")
        assert repointed, "no wrapper re-pointed the dirs after the harness planted"
        assert any(all(v == "ok" for v in r["results"].values()) for r in repointed), repointed


def test_nothing_was_created_or_chowned_in_the_decoy(run: AttackRun) -> None:
    """The decoy (a stand-in for /etc/cron.hourly) is empty, root's and 0755 after the run."""
    assert sorted(p.name for p in run.decoy.iterdir()) == [], run.records("landed")
    info = run.decoy.lstat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o755)
    assert run.records("landed") == [], "the helper found harness-made objects in the decoy"


def test_no_attacked_cell_passes_and_a_reason_names_the_symlink(run: AttackRun) -> None:
    """No attacked cell passes, and each one's reason names the symlink into the decoy.

    Under the race only the symlinker's fs_read_secrets cell is attacked for certain: its own
    wrapper re-points ~/.ssh after the harness planted in it.
    """
    cells = run.cells()
    if run.mode == "plant":
        attacked = {f"{b}-{p}": cells[f"{b}-{p}"] for b in ("none", BACKEND) for p in PROBES}
    else:
        # Only the symlinker's cell has a helper of its own running while it is judged; the
        # control leg's cells meet whatever state a helper left, which may be a plain dir.
        attacked = {f"{BACKEND}-fs_read_secrets": cells[f"{BACKEND}-fs_read_secrets"]}
    for cell_id, cell in attacked.items():
        assert cell["verdict"] != "PASS", (cell_id, cell["reason"])
    reasons = {cell_id: str(cell["reason"]) for cell_id, cell in attacked.items()}
    if run.mode == "plant":
        named = [c for c, r in reasons.items() if "symlink" in r and str(run.decoy) in r]
    else:
        # Judged after its wrapper re-pointed ~/.ssh, and after its helper's last flip: the
        # host finds the link to the decoy, or a fresh dir that is not the one it planted in.
        named = [
            c
            for c, r in reasons.items()
            if "~/.ssh" in r and (str(run.decoy) in r or "another directory now" in r)
        ]
    assert sorted(named) == sorted(attacked), reasons


def test_the_gate_is_not_passed(run: AttackRun) -> None:
    """The run exits non-zero and its gate line is never PASSED."""
    gate = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")]
    assert gate, run.stdout[-3000:] + run.stderr[-2000:]
    assert gate[-1] != "gate: PASSED"
    assert run.returncode != 0
