"""Where the data folders (`probes/`, `fixtures/`, `matrix/`) live, in a clone or a wheel.

In a clone they sit next to the `harness` package; an installed wheel carries them as package
data under `harness/_data/<name>` (pyproject's `force-include`). The wheel's copy wins when it
exists: installed, the folder beside the package is site-packages, where a folder named
`probes` or `matrix` may belong to another distribution entirely. A clone (or an editable
install) has no `_data`, so it reads the files being edited.
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import FixtureError

_PACKAGE_DIR = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    """The folder `name`: the wheel's `_data` copy, else the clone's copy beside the package.

    Raises:
        FixtureError: neither copy exists (a broken install).
    """
    candidates = (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name)
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise FixtureError(
        f"the data folder {name!r} is missing (looked in {tried}); run from a clone of "
        "sandbox-attest or reinstall the wheel, which carries it under harness/_data/"
    )


def probes_dir() -> Path:
    """The folder of probe payloads (`probes/<id>.py`)."""
    return _data_dir("probes")


def fixtures_dir() -> Path:
    """The folder of fixture data (`hosts.toml`, `blob.toml`, `canary_wheel/`)."""
    return _data_dir("fixtures")


def matrix_dir() -> Path:
    """The folder of the pytest matrix, backend specs and release policy."""
    return _data_dir("matrix")
