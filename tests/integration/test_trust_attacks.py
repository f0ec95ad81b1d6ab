"""Issue 12's attacks, live: a hostile wrapper against a real `sandbox-attest run`.

The wrapper (tests/data/attacker/wrapper.py) claims a confining policy but runs its payload
with no sandbox at all. Before that it tries to take the signing key (its ancestors' environ,
cwd and `--key` files; the signer's environ, mem, maps and ptrace) and to plant links and a
FIFO in the report directory, and it leaves a detached helper (new session, fresh environment)
meant to keep retrying the plants through the signing; the cell's group ends it with its cell.
Every result lands as an errno name in a drop directory the payload user can write.

The issue's "done means": a wrapper that runs its payload with no sandbox at all cannot make
`verify` accept anything it wrote; the best it can do is damage the run, and that must end in
a non-PASS gate. So every attempt must fail (EACCES/EPERM), the gate must be FAILED because
the bare payload escapes, and what `verify` checks must be exactly what the harness judged.

Every test fails closed: a run whose wrapper left no records, never found the report dir, or
never met this run's own signer fails here; nothing passes for lack of an attack. Real
processes, real uids, a real key; root only (the harness separates trust domains only as root).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.attest import ATTESTATION_NAME, EVIDENCE_NAME, dsse
from sandbox_attest.attest.keys import ENV_VAR, load_trusted_key
from sandbox_attest.attest.statement import TEST_RESULT_PREDICATE, parse_statement
from sandbox_attest.attest.verification import Checks
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.report.policy import load_policy
from sandbox_attest.run.hostview import LAUNCHER
from tests.integration.test_cli_run import CLI, keypair

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="uid separation needs root; the non-root harness variant is not written",
    ),
    pytest.mark.timeout(180),
]

REPO = Path(__file__).parent.parent.parent
ATTACKER = Path(__file__).parent.parent / "data" / "attacker"
PROBES = ("net_direct_egress", "fs_write_outside")
BACKEND = "attacker"
# The plants the wrapper aims at: the old temp name and every file a person reads.
PLANTS = frozenset(
    {
        "evidence.json.tmp",
        "evidence.json",
        "junit.xml",
        "report.html",
        "summary.md",
        "allure-results/forged-result.json",
    }
)
FORGED_MARK = b"FORGED-BY-ATTACKER-WRAPPER"  # tests/data/attacker/wrapper.py writes it
REFUSED = frozenset({"EACCES", "EPERM"})
# The helper stops at the stop file the fixture makes after the run; the bound only makes it
# stop by itself should this test die first.
HELPER_BOUND_S = 60
HELPER_STOP_WAIT_S = 5.0
# A run takes ~5 s here; a harness that blocks on a planted FIFO (the old writer) never ends.
RUN_TIMEOUT_S = 90


@dataclass(frozen=True)
class AttackRun:
    """One `sandbox-attest run` with the attacker wrapper named, and what it left behind."""

    via: str  # "key-file" (--key PATH) or "key-env" ($SANDBOX_ATTEST_SIGNING_KEY)
    root: Path
    wrapper: Path
    drop: Path
    out: Path
    private: Path
    public: Path
    policy: Path
    pem: bytes
    cli_pid: int
    returncode: int
    stdout: str
    stderr: str
    ended_at: float

    def records(self, attack: str | None = None) -> list[dict[str, Any]]:
        """The wrapper's result lines (of one attack); fails when the wrapper left none."""
        path = self.drop / "attacks.jsonl"
        assert path.is_file(), (
            f"the attacker wrapper left no {path}: it never ran, so nothing was attacked "
            f"(run stdout tail: {self.stdout[-2000:]!r}, stderr: {self.stderr[-1000:]!r})"
        )
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert lines, f"{path} is empty: the wrapper ran but recorded nothing"
        return [r for r in lines if attack is None or r["attack"] == attack]

    def one(self, attack: str) -> dict[str, Any]:
        """The single record of `attack` (the helper's start and done lines)."""
        found = self.records(attack)
        assert len(found) == 1, f"expected one {attack!r} record, got {found}"
        return found[0]

    def uids(self) -> dict[str, int | None]:
        """Ancestor target ("ancestor:<pid>") -> the uid owning its /proc entry."""
        return {r["target"]: r["uid"] for r in self.records("ancestor-argv")}


def render_spec(root: Path, wrapper: Path, drop: Path) -> Path:
    """The attacker spec for this test's paths (the template's @NAME@ tokens filled in)."""
    text = (ATTACKER / "spec.toml.in").read_text()
    for token, value in (
        ("@WRAPPER@", str(wrapper)),
        ("@DROP_DIR@", str(drop)),
        ("@HELPER_SECONDS@", str(HELPER_BOUND_S)),
        # Where every run of this module writes its report (`attack`): the harness no longer
        # shows `--out` in its cmdline, so the attacker is told, as one that guessed it.
        ("@REPORT_DIR@", str(root / "report")),
        ("@KEY_FILE@", str(root / "signing.pem")),  # where `keypair` writes the private key
    ):
        text = text.replace(token, value)
    spec = root / "attacker.toml"
    spec.write_text(text)
    return spec


def install(source: Path, target: Path) -> Path:
    """Put a wrapper script at `target`, executable by the payload user."""
    shutil.copyfile(source, target)
    target.chmod(0o755)
    return target


def small_matrix(root: Path) -> Path:
    """The two probes an unconfined payload escapes in, plus the control leg."""
    path = root / "matrix.toml"
    path.write_text(
        "".join(f'[[probe]]\nid = "{p}"\ntimeout = 30\n' for p in PROBES)
        + '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
    )
    return path


def control_policy(root: Path) -> Path:
    """A policy requiring the control leg's cells; the named attacker is required by name."""
    path = root / "policy.toml"
    probes = ", ".join(f'"{p}"' for p in PROBES)
    path.write_text(f'[[require]]\nplatform = "linux"\nbackend = "none"\nprobes = [{probes}]\n')
    return path


def stop_helper(drop: Path, wrapper: Path) -> None:
    """Make the detached helper stop (stop file); SIGKILL it if it does not, naming it.

    Only the helper of this test is killed: its pid comes from its own start record and its
    cmdline must name this test's wrapper copy and `--helper`.
    """
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


def attack(root: Path, via: str) -> AttackRun:
    """Run `sandbox-attest run` with the attacker named and the key given `via` one route."""
    drop = root / "drop"
    drop.mkdir()
    drop.chmod(0o777)  # the payload user records there; nothing of the harness lives there
    wrapper = install(ATTACKER / "wrapper.py", root / "wrapper.py")
    spec = render_spec(root, wrapper, drop)
    private, public = keypair(root)
    info = private.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600), "K must be a 0600 root file"
    pem = private.read_bytes()
    policy = control_policy(root)
    out = root / "report"
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    argv = [
        *CLI,
        "run",
        "--matrix",
        str(small_matrix(root)),
        "--policy",
        str(policy),
        "--backend-spec",
        str(spec),
        "--out",
        str(out),
        "-j",
        "2",
    ]
    if via == "key-file":
        argv += ["--key", str(private)]
    else:
        env[ENV_VAR] = pem.decode()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        ended_at = time.time()
        stop_helper(drop, wrapper)
    return AttackRun(
        via=via,
        root=root,
        wrapper=wrapper,
        drop=drop,
        out=out,
        private=private,
        public=public,
        policy=policy,
        pem=pem,
        cli_pid=proc.pid,
        returncode=proc.returncode,
        stdout=stdout,
        stderr=stderr,
        ended_at=ended_at,
    )


@pytest.fixture(scope="module", params=["key-file", "key-env"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AttackRun:
    """One attacked run per way of handing over the key, shared by the checks below."""
    via = str(request.param)
    return attack(tmp_path_factory.mktemp(f"attack-{via}"), via)


def pem_body_lines(pem: bytes) -> list[bytes]:
    """The base64 lines of a PEM block (what a thief would have to carry away)."""
    return [ln for ln in pem.splitlines() if ln and not ln.startswith(b"-----")]


def report_bytes(path: Path) -> bytes:
    """A report file's bytes, refusing a link or a FIFO (a read of a planted FIFO never ends)."""
    mode = path.lstat().st_mode
    assert stat.S_ISREG(mode), f"{path} is not a regular file (mode {mode:o}): a plant landed"
    return path.read_bytes()


def regular_files(root: Path) -> Iterator[Path]:
    """Every regular file under `root`, never following links nor opening a FIFO."""
    for path in sorted(root.rglob("*")):
        if stat.S_ISREG(path.lstat().st_mode):
            yield path


class TestAttacksFail:
    """Each attack of issue 12, tried live by the wrapper, failed."""

    def test_the_wrapper_attacked_this_run(self, run: AttackRun) -> None:
        """The wrapper ran in every attacker cell and once for availability, and found its dir."""
        execs = run.records("exec")
        cells = [e for e in execs if any(arg.endswith(f"/{LAUNCHER}") for arg in e["argv"])]
        assert len(cells) == len(PROBES)
        # The availability test command runs under the wrapper too: one more chance to attack.
        assert len(execs) == len(PROBES) + 1
        for entry in run.records("ancestors"):
            assert run.cli_pid in entry["chain"]
            assert entry["uid"] == entry["euid"] != 0
        for entry in run.records("report-dirs"):
            # No ancestor's cmdline names the report dir any more (a neutral title, issue
            # 23); the attacker attacks the path it was told, as one that guessed it.
            assert entry["found"] == []
            assert entry["told"] == str(run.out)

    def test_key_material_never_left_the_harness(self, run: AttackRun) -> None:
        """The key's base64 body is nowhere in the drop dir, and nothing was looted."""
        body = pem_body_lines(run.pem)
        assert body
        for path in regular_files(run.drop):
            data = path.read_bytes()
            assert not any(line in data for line in body), f"key material in {path}"
            assert b"PRIVATE KEY" not in data, f"a PEM private key in {path}"
        assert not sorted(run.drop.glob("loot-*")), "the wrapper kept loot"
        for entry in run.records("self-environ"):
            assert entry["has_key_var"] is False

    def test_root_ancestors_environ_cwd_and_key_file_refused(self, run: AttackRun) -> None:
        """Every root ancestor's environ, cwd and --key file refused the payload user."""
        uids = run.uids()
        cli = f"ancestor:{run.cli_pid}"
        assert uids[cli] == 0
        for attack_name in ("ancestor-environ", "ancestor-cwd"):
            tried = [r for r in run.records(attack_name) if uids.get(r["target"]) == 0]
            assert cli in {r["target"] for r in tried}
            for entry in tried:
                assert entry["ok"] is False, entry
                assert entry["errno"] in REFUSED, entry
        key_reads = run.records("key-file")
        # The harness shows a neutral title (issue 23): `--key` is in no ancestor's cmdline
        # whichever way the key came; the attacker reads the path it was told, as a guesser.
        cli_argv = next(r for r in run.records("ancestor-argv") if r["target"] == cli)
        assert cli_argv["keys"] == []
        assert {r["path"] for r in key_reads} == {str(run.private)}
        for entry in key_reads:
            assert (entry["ok"], entry["errno"]) == (False, "EACCES"), entry

    def test_signer_environ_mem_and_ptrace_refused(self, run: AttackRun) -> None:
        """This run's signer (and any other) refused its environ, maps, mem and ptrace."""
        found = run.records("signer-found")
        ours = {r["target"] for r in found if r["ppid"] == run.cli_pid}
        assert len(ours) == 1, f"the wrapper never met this run's signer: {found}"
        for target in {r["target"] for r in found}:
            for attack_name in ("signer-environ", "signer-maps", "signer-mem", "signer-ptrace"):
                tried = [r for r in run.records(attack_name) if r["target"] == target]
                assert tried, f"{attack_name} never tried on {target}"
                for entry in tried:
                    assert entry["ok"] is False, entry
                    assert entry["errno"] in REFUSED, entry

    def test_every_plant_in_the_report_dir_refused(self, run: AttackRun) -> None:
        """Each link, the FIFO link and the allure file: EACCES in every attacker cell."""
        plants = run.records("plant")
        assert {r["target"] for r in plants} == PLANTS
        # Once per cell and once in the availability test command, which runs under it too.
        assert len(plants) == len(PLANTS) * (len(PROBES) + 1)
        for entry in plants:
            assert entry["out"] == str(run.out)
            assert (entry["ok"], entry["errno"]) == (False, "EACCES"), entry
        for entry in run.records("report-list"):
            assert (entry["ok"], entry["errno"]) == (False, "EACCES"), entry

    def test_detached_helper_was_ended_with_its_cell(self, run: AttackRun) -> None:
        """The helper left session and environment, not its cell's group: ended before signing.

        It once outlived the run (no run tag followed it) and retried its plants through the
        signing; now the harness's sweep kills every member of the cell's group once the
        wrapper is gone (sandbox_attest/host/cellgroup.py), so it never reaches its own end.
        """
        start = run.one("helper-start")
        assert start["outs"] == [str(run.out)]
        assert run.records("helper-done") == []  # killed, never stopped by itself
        last = max(r["time"] for r in run.records() if r["pid"] == start["pid"])
        assert last < run.ended_at
        assert not Path(f"/proc/{start['pid']}").exists()
        for progress in run.records("helper-progress"):
            for target, results in progress["results"].items():
                assert set(results) <= {"EACCES"}, (target, results)
        assert run.records("helper-plant-landed") == []
        assert run.records("helper-fifo-served") == []
        assert not (run.drop / "captured-through-fifo.bin").exists()


class TestDamageEndsInAFailedGate:
    """The bare payload escapes, and the report says so in bytes only the harness wrote."""

    def test_gate_failed_on_the_escapes(self, run: AttackRun) -> None:
        """Exit 1, gate FAILED, naming the attacker's FAIL cells."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        gate_lines = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")]
        assert gate_lines[-1] == "gate: FAILED"
        for probe in PROBES:
            assert f"gate: required cell {BACKEND}-{probe} is FAIL: escape observed" in run.stdout
        cells = json.loads(report_bytes(run.out / EVIDENCE_NAME))["cells"]
        attacked = {c["cell_id"]: (c["verdict"], c["required"]) for c in cells}
        assert attacked == {
            **{f"none-{p}": ("PASS", True) for p in PROBES},
            **{f"{BACKEND}-{p}": ("FAIL", True) for p in PROBES},
        }

    def test_report_dir_is_roots_alone(self, run: AttackRun) -> None:
        """OUT is 0700 root; every entry in it is a root-owned file or directory, no link."""
        info = run.out.lstat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode), stat.S_ISDIR(info.st_mode)) == (
            0,
            0o700,
            True,
        )
        entries = sorted(run.out.rglob("*"))
        assert (run.out / ATTESTATION_NAME) in entries
        for path in entries:
            mode = path.lstat()
            assert mode.st_uid == 0, path
            assert stat.S_ISREG(mode.st_mode) or stat.S_ISDIR(mode.st_mode), path
        for path in regular_files(run.out):
            data = path.read_bytes()
            assert FORGED_MARK not in data, f"forged bytes in {path}"
            assert not any(line in data for line in pem_body_lines(run.pem)), path

    def test_verify_refuses_the_report(self, run: AttackRun) -> None:
        """`verify --trusted-key K.pub --partial` exits non-zero, with the run's policy too."""
        report_bytes(run.out / EVIDENCE_NAME)  # a planted FIFO would hang verify, not fail it
        base = [*CLI, "verify", str(run.out), "--trusted-key", str(run.public), "--partial"]
        for argv in (base, [*base, "--policy", str(run.policy)]):
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO
            )
            assert done.returncode == 1, done.stdout + done.stderr
            assert f"FAILED: {run.out} does not verify" in done.stderr
            for probe in PROBES:
                assert f"{BACKEND}-{probe} is FAIL: escape observed" in done.stderr

    def test_verify_checked_the_judged_evidence(self, run: AttackRun) -> None:
        """Signature and subjects hold; the only reasons are the FAIL cells; signed gate FAILED."""
        evidence_sha = hashlib.sha256(report_bytes(run.out / EVIDENCE_NAME)).hexdigest()
        trusted = load_trusted_key(run.public)
        verification = verify_report(
            run.out,
            trusted,
            load_policy(run.policy),
            require_all_legs=False,
            checks=Checks(untrusted_keyids=frozenset()),
        )
        assert sorted(r.split(" is FAIL: ")[0] for r in verification.reasons) == sorted(
            f"{BACKEND}-{p}" for p in PROBES
        ), verification.reasons
        statements = []
        for line in report_bytes(run.out / ATTESTATION_NAME).decode().splitlines():
            envelope = dsse.Envelope.from_json(line)
            payload = dsse.verify(envelope, trusted.public_key, trusted.keyid)
            statements.append(parse_statement(payload, ATTESTATION_NAME))
        for stmt in statements:
            # A test-result statement is about the sandbox: it pins the report files in its
            # configuration; the evidence statement names them as its subjects.
            pinned = (
                stmt["predicate"]["configuration"]
                if stmt["predicateType"] == TEST_RESULT_PREDICATE
                else stmt["subject"]
            )
            subjects = {s["name"]: s.get("digest", {}).get("sha256") for s in pinned}
            assert subjects[EVIDENCE_NAME] == evidence_sha
        results = [
            s["predicate"]["result"]
            for s in statements
            if s["predicateType"] == TEST_RESULT_PREDICATE
        ]
        console = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")][-1]
        # One statement per backend (the control and the wrapper), each FAILED here.
        assert results == ["FAILED", "FAILED"]
        assert console == f"gate: {results[0]}"
        assert json.loads(report_bytes(run.out / "signing.json"))["gate"] == "FAILED"


class TestIdentityPinsTheWrapper:
    """Swapping the wrapper file behind an unchanged spec path changes the backend identity."""

    def test_honest_then_leaky_script_at_one_path(self, tmp_path: Path) -> None:
        """Honest script, then the attacker at the same path: two executable digests."""
        drop = tmp_path / "drop"
        drop.mkdir()
        wrapper = install(ATTACKER / "honest.py", tmp_path / "wrapper.py")
        spec = render_spec(tmp_path, wrapper, drop)
        before = CommandBackend.from_path(spec).availability()
        # Same path, same inode: only the bytes change, as a swapped binary would.
        wrapper.write_bytes((ATTACKER / "wrapper.py").read_bytes())
        after = CommandBackend.from_path(spec).availability()
        assert before.ok, before.reason
        assert after.ok, after.reason
        assert before.identity is not None
        assert after.identity is not None
        pins = [i.executables[str(wrapper)]["sha256"] for i in (before.identity, after.identity)]
        assert pins == [
            hashlib.sha256((ATTACKER / name).read_bytes()).hexdigest()
            for name in ("honest.py", "wrapper.py")
        ]
        assert pins[0] != pins[1]
        assert before.identity.spec_sha256 == after.identity.spec_sha256
        assert before.identity.as_dict() != after.identity.as_dict()
