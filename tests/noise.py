"""A busy host for live tests and soaks: other programs' directories coming and going.

On a real machine `/tmp` and `/run` are not still. A browser keeps a private (0700, root)
directory with its singleton socket in `/tmp`; `mktemp -d` directories appear and vanish every
few milliseconds, some private, some with sockets and writable subdirectories; a directory is
removed, or removed and made again under the same name, by its owner while a cell runs. The
harness must plant and judge only where that cannot change a verdict (issue 24, part 3).

`busy_host()` is that host, as a context manager: while it is open, a background thread keeps
creating and removing such directories under each root (by default `/tmp` and `/run`, the two
trees the witness sockets and canaries are planted in), at a random pace of a few ms to
`period_s[1]`, each living a random few ms to `lifetime_s[1]`. Long lifetimes matter as much
as short ones: a directory found by the harness's scan, planted in, then removed before the
cell is judged is the case that once made a false FAIL.

Everything it makes is named like `mktemp -d`'s output (`tmp.XXXXXXXXXX`) or like a browser's
(`org.chromium.Chromium.XXXXXX`), is root's, and is removed on exit: only what this generator
made (the same path at the same inode), never anything else under the root.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import shutil
import socket
import stat
import string
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

# What mktemp(1) and Chromium put in the random part of their names.
_ALPHABET = string.ascii_letters + string.digits
# How many transient directories one root holds at once: enough that any walk meets several,
# few enough that the generator's own descriptors stay bounded.
LIVE_MAX = 24


def _rand(n: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))


@dataclass
class _Made:
    """One transient directory: where, its inode, its listener, when its owner removes it."""

    path: Path
    ino: int
    listener: socket.socket | None
    until: float
    # Removed and made again under the same name (a restart), instead of removed for good.
    replace: bool


@dataclass
class Noise:
    """What a `busy_host()` made while it ran, for a test's message or a soak's table.

    Attributes:
        roots: the directories it made its transient directories in.
        private: the root-only 0700 directory with a listening socket (a browser's).
        created: how many transient directories it made.
        removed: how many it removed (its owner's removal, during the run).
        replaced: how many of those it made again under the same name at once.
        paths: every transient directory it made, so a test can tell that its cell met them.
    """

    roots: tuple[Path, ...]
    private: Path | None = None
    created: int = 0
    removed: int = 0
    replaced: int = 0
    errors: list[str] = field(default_factory=list)
    paths: set[Path] = field(default_factory=set)

    def summary(self) -> str:
        """One line: what the busy host did, for an assertion's message."""
        return (
            f"noise under {', '.join(map(str, self.roots))}: {self.created} dirs made, "
            f"{self.removed} removed ({self.replaced} replaced), private dir {self.private}"
            + (f", errors: {self.errors[:3]}" if self.errors else "")
        )


def _listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(4)
    except OSError:
        sock.close()
        raise
    return sock


def _make(root: Path, rng: random.Random, lifetime_s: tuple[float, float]) -> _Made:
    """One transient directory under `root`, shaped as another program's.

    A third are private (0700, as `mktemp -d` leaves them); the rest are 0755 with a listening
    socket (so the witness walk picks them) and a world-writable subdirectory (so the payload
    user's writable-place scan finds it). The socket is made in every one: a private directory
    with a socket is what the chromium case was.
    """
    path = root / f"tmp.{_rand(10)}"
    path.mkdir(mode=0o700)
    private = rng.random() < 1 / 3
    if not private:
        path.chmod(0o755)
        writable = path / "w"
        writable.mkdir()
        # chmod, not mkdir's mode: the umask would take the write bits away.
        writable.chmod(0o777)
    listener = _listen(path / "s.sock")
    return _Made(
        path=path,
        ino=path.lstat().st_ino,
        listener=listener,
        until=time.monotonic() + rng.uniform(*lifetime_s),
        replace=rng.random() < 1 / 4,
    )


def _remove(made: _Made) -> None:
    """Remove a transient directory, only if the path is still the one this generator made."""
    if made.listener is not None:
        made.listener.close()
    with contextlib.suppress(OSError):
        info = made.path.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_ino == made.ino:
            shutil.rmtree(made.path, ignore_errors=True)


def _private_dir(root: Path) -> tuple[Path, socket.socket]:
    """The browser's private directory: root's, 0700, with a listening singleton socket."""
    path = root / f"org.chromium.Chromium.{_rand(6)}"
    path.mkdir(mode=0o700)
    return path, _listen(path / "SingletonSocket")


def _churn(
    roots: tuple[Path, ...],
    noise: Noise,
    stop: threading.Event,
    period_s: tuple[float, float],
    lifetime_s: tuple[float, float],
    live: list[_Made],
) -> None:
    """The generator's loop: make one directory per tick, remove those whose time is up."""
    rng = random.Random()  # noqa: S311  (noise, not secrets)
    while not stop.wait(rng.uniform(*period_s)):
        now = time.monotonic()
        for made in [m for m in live if m.until <= now]:
            live.remove(made)
            _remove(made)
            noise.removed += 1
            if made.replace:
                # The owner restarts: the same name again at once, a new directory.
                with contextlib.suppress(OSError):
                    again = made.path
                    again.mkdir(mode=0o755)
                    live.append(
                        _Made(
                            again,
                            again.lstat().st_ino,
                            None,
                            now + rng.uniform(*lifetime_s),
                            replace=False,
                        )
                    )
                    noise.replaced += 1
        for root in roots:
            if sum(1 for m in live if m.path.parent == root) >= LIVE_MAX:
                continue
            try:
                made = _make(root, rng, lifetime_s)
            except OSError as exc:
                noise.errors.append(f"{root}: {exc}")
                continue
            live.append(made)
            noise.paths.add(made.path)
            noise.created += 1


@contextlib.contextmanager
def busy_host(
    roots: tuple[str | Path, ...] = ("/tmp", "/run"),
    *,
    period_s: tuple[float, float] = (0.002, 0.05),
    lifetime_s: tuple[float, float] = (0.005, 3.0),
    private: bool = True,
) -> Iterator[Noise]:
    """Keep the host busy under `roots` until the block ends; then remove all it made.

    Args:
        roots: where the transient directories go; a root that does not exist is skipped.
        period_s: the pause between two ticks of the loop, drawn uniformly from this range.
        lifetime_s: how long each transient directory lives, drawn uniformly from this range.
        private: also keep a root-only 0700 directory with a listening socket in the first
            root for the whole block (the browser's singleton directory).

    Yields:
        The `Noise` record, updated as the generator runs.
    """
    present = tuple(Path(r) for r in roots if Path(r).is_dir())
    noise = Noise(roots=present)
    stop = threading.Event()
    live: list[_Made] = []
    held: tuple[Path, socket.socket] | None = None
    if private and present:
        held = _private_dir(present[0])
        noise.private = held[0]
    thread = threading.Thread(
        target=_churn,
        args=(present, noise, stop, period_s, lifetime_s, live),
        name="busy-host-noise",
        daemon=True,
    )
    thread.start()
    try:
        yield noise
    finally:
        stop.set()
        thread.join(timeout=10.0)
        for made in live:
            _remove(made)
        if held is not None:
            held[1].close()
            shutil.rmtree(held[0], ignore_errors=True)


def main() -> int:
    """`python3 -m tests.noise`: keep /tmp and /run busy until SIGTERM or SIGINT (a soak's noise).

    Prints the summary line when it stops, so the soak's log says what the suite ran beside.
    """
    import signal  # noqa: PLC0415  (only the command needs it; importing modules stay lean)

    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    with busy_host() as noise:
        stopped.wait()
    print(noise.summary(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
