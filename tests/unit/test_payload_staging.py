"""The payload's files as a wrapper sees them: neutral names, staged copies (issue 23)."""

from __future__ import annotations

import stat
from typing import TYPE_CHECKING

from sandbox_attest.backends.base import shim_path
from sandbox_attest.catalog import probe_path
from sandbox_attest.host import proctitle
from sandbox_attest.paths import probes_dir
from sandbox_attest.payload import (
    INPUT_DIR,
    LAUNCHER_SOURCE,
    SCRATCH_PREFIX,
    STAGED_LAUNCHER,
    STAGED_PROGRAM,
    STAGED_SHIM,
    STAGED_TASK,
    TELLTALE_WORDS,
    stage_payload,
    stage_shim,
)
from sandbox_attest.run import hostview, sweep

if TYPE_CHECKING:
    from pathlib import Path


def telltales(text: str) -> list[str]:
    """The telltale words in `text`, case-insensitively."""
    return [word for word in TELLTALE_WORDS if word in text.lower()]


def test_the_host_finds_the_payload_by_the_staged_launcher_name() -> None:
    """The host looks for the name the launcher is staged under, not the repository's."""
    assert hostview.LAUNCHER == STAGED_LAUNCHER
    assert (probes_dir() / LAUNCHER_SOURCE).is_file()


def test_every_name_a_wrapper_sees_is_neutral() -> None:
    """The staged file names, the scratch prefix and the proxy's title carry no telltale word."""
    names = [STAGED_LAUNCHER, STAGED_PROGRAM, STAGED_TASK, STAGED_SHIM, INPUT_DIR, SCRATCH_PREFIX]
    names += [*proctitle.harness_title(), *proctitle.signer_title()]
    names += proctitle.proxy_title("/tmp/proxy-config-x.json")
    assert [n for n in names if telltales(n)] == []


def test_stage_payload_copies_the_files_read_only_for_the_payload(tmp_path: Path) -> None:
    """Launcher, probe and shim are byte-identical 0644 copies; the task is the JSON given."""
    directory = tmp_path / "input"
    directory.mkdir(mode=0o755)
    program = probe_path("net_direct_egress")
    launcher = probes_dir() / LAUNCHER_SOURCE
    shim = stage_shim(tmp_path, shim_path())
    staged = stage_payload(directory, launcher, program, {"nonce": "n1"})
    assert staged.launcher.read_bytes() == launcher.read_bytes()
    assert staged.program.read_bytes() == program.read_bytes()
    assert shim.read_bytes() == shim_path().read_bytes()
    assert staged.task.read_text() == '{\n "nonce": "n1"\n}'
    for path in (staged.launcher, staged.program, staged.task, shim):
        assert path.parent == directory
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        assert telltales(path.name) == []


def test_the_sweep_still_finds_a_retitled_proxy_and_only_ours() -> None:
    """`python -m relay <tmp>/proxy-config-*.json` is the harness's; another relay is not."""
    ours = [w.encode() for w in proctitle.proxy_title("/tmp/proxy-config-ab12.json")]
    assert sweep.is_harness_child(ours)
    assert not sweep.is_harness_child([b"/usr/bin/python3", b"-m", b"relay", b"/etc/relay.conf"])


def test_the_sweep_knows_the_neutral_check_dirs() -> None:
    """A killed availability check's `agent-check-*` dir is the sweep's; a bare `agent-*` is not."""
    assert sweep.TMP_NAMES.match("agent-check-k2j3h4l5")
    assert not sweep.TMP_NAMES.match(f"{SCRATCH_PREFIX}k2j3h4l5")
