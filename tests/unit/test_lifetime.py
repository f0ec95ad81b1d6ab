"""sandbox_attest.host.lifetime: real children, real SIGKILLs, read back from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sandbox_attest.host import lifetime

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only"
)

ROOT = str(Path(__file__).resolve().parents[2])
READ_OWN = (
    f"import sys; sys.path.insert(0, {ROOT!r}); "
    "from sandbox_attest.host.lifetime import own_parent_death_signal as f; print(f())"
)


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    """Whether `pid` stops being alive within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return False


def run_driver(code: str) -> subprocess.Popen[str]:
    """Start a Python driver process that runs `code` with the repo importable."""
    return subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n" + code],
        stdout=subprocess.PIPE,
        text=True,
    )


class TestArmed:
    def test_child_has_sigkill_armed(self) -> None:
        """A child started with popen_kwargs() has SIGKILL as its parent-death signal."""
        done = subprocess.run(
            [sys.executable, "-c", READ_OWN],
            capture_output=True,
            text=True,
            check=True,
            **lifetime.popen_kwargs(),
        )
        assert done.stdout.strip() == str(int(signal.SIGKILL))

    def test_child_without_it_has_none(self) -> None:
        """Control: a child started without it has no parent-death signal."""
        done = subprocess.run(
            [sys.executable, "-c", READ_OWN], capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == "0"

    @pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
    def test_setting_survives_the_uid_switch(self) -> None:
        """Started as another uid (subprocess's user=), the child still has SIGKILL armed."""
        done = subprocess.run(
            [sys.executable, "-c", READ_OWN],
            capture_output=True,
            text=True,
            check=True,
            user=65534,
            group=65534,
            extra_groups=[],
            **lifetime.popen_kwargs(),
        )
        assert done.stdout.strip() == str(int(signal.SIGKILL))


class TestDeath:
    def test_child_dies_when_its_parent_is_sigkilled(self) -> None:
        """SIGKILL of the parent kills its armed child; an unarmed sibling survives it."""
        driver = run_driver(
            textwrap.dedent(
                """
                import subprocess, time
                from sandbox_attest.host import lifetime
                armed = subprocess.Popen(["sleep", "300"], **lifetime.popen_kwargs())
                bare = subprocess.Popen(["sleep", "300"], start_new_session=True)
                print(armed.pid, bare.pid, flush=True)
                time.sleep(300)
                """
            )
        )
        assert driver.stdout is not None
        armed, bare = (int(p) for p in driver.stdout.readline().split())
        try:
            assert alive(armed)
            driver.kill()
            driver.wait(timeout=10)
            assert gone_within(armed, 5)
            assert alive(bare)  # the control: without the setting the child is orphaned
        finally:
            os.kill(bare, signal.SIGKILL)
            driver.stdout.close()

    def test_child_of_a_thread_dies_with_that_thread(self) -> None:
        """A child forked from a thread dies when that thread ends; the main thread's lives on."""
        driver = run_driver(
            textwrap.dedent(
                """
                import subprocess, threading, time
                from sandbox_attest.host import lifetime
                pids = []
                def spawn():
                    pids.append(subprocess.Popen(["sleep", "300"], **lifetime.popen_kwargs()).pid)
                worker = threading.Thread(target=spawn)
                worker.start()
                worker.join()
                main = subprocess.Popen(["sleep", "300"], **lifetime.popen_kwargs())
                print(pids[0], main.pid, flush=True)
                time.sleep(300)
                """
            )
        )
        assert driver.stdout is not None
        from_thread, from_main = (int(p) for p in driver.stdout.readline().split())
        try:
            assert gone_within(from_thread, 5)
            assert alive(from_main)
        finally:
            driver.kill()
            driver.wait(timeout=10)
            driver.stdout.close()
        assert gone_within(from_main, 5)

    def test_child_whose_parent_changed_before_arming_exits(self) -> None:
        """A child whose parent is not the one that built the hook exits 125 before exec."""
        driver = run_driver(
            textwrap.dedent(
                """
                import os, subprocess
                from sandbox_attest.host import lifetime
                arm = lifetime.die_with_harness()  # captures this pid
                child = os.fork()
                if child == 0:
                    # The forked copy stands for "another parent": its children must refuse.
                    code = subprocess.run(["sleep", "300"], preexec_fn=arm).returncode
                    os._exit(code)
                print(os.waitpid(child, 0)[1] >> 8, flush=True)
                """
            )
        )
        out, _ = driver.communicate(timeout=30)
        assert out.strip() == str(lifetime.ORPHANED_EXIT)
