"""Where the data folders (`probes/`, world data in `fixtures/`, `matrix/`) live, clone or wheel.

In a clone they sit next to the `sandbox_attest` package; an installed wheel carries them as package
data under `sandbox_attest/_data/<name>` (pyproject's `force-include`). The wheel's copy wins when
it exists: installed, the folder beside the package is site-packages, where a folder named `probes`
or `matrix` may belong to another distribution entirely. A clone (or an editable install) has no
`_data`, so it reads the files being edited.
"""

from __future__ import annotations

from pathlib import Path

from sandbox_attest.errors import FixtureError

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
        "sandbox-attest or reinstall the wheel, which carries it under sandbox_attest/_data/"
    )


# A readable copy of the payload files, where the installed ones are out of the payload
# user's reach (sandbox_attest/run/reach.py makes it in the run's scratch); None: the installed.
_payload_copy: Path | None = None


def use_payload_copy(root: Path | None) -> None:
    """Make `probes_dir()` and the egress shim name the copy under `root` (None: the install)."""
    global _payload_copy  # noqa: PLW0603  (one run per process; every reader must follow it)
    _payload_copy = root


def payload_copy() -> Path | None:
    """The root of the run's copy of the payload files, or None when the installed ones serve."""
    return _payload_copy


def probes_dir() -> Path:
    """The folder of probe payloads (`probes/<id>.py`): the run's copy when it made one."""
    if _payload_copy is not None:
        return _payload_copy / "probes"
    return _data_dir("probes")


def fixtures_dir() -> Path:
    """The folder of fixture data (`hosts.toml`, `blob.toml`, `canary_wheel/`)."""
    return _data_dir("fixtures")


def matrix_dir() -> Path:
    """The folder of the pytest matrix, backend specs and release policy."""
    return _data_dir("matrix")


def default_matrix() -> Path:
    """The matrix a run uses when none is given: the installed package's `matrix.toml`.

    A `matrix/` folder in the current directory is never picked up by itself: a project
    with its own unrelated `matrix/` must not change what a run attests. Pass `--matrix`
    (or `pytest --sandbox-attest FILE`) to use another.
    """
    return matrix_dir() / "matrix.toml"


def default_policy() -> Path:
    """The release policy `run`, `verify` and `merge` use when `--policy` is not given."""
    return matrix_dir() / "policy.toml"


def default_legs() -> Path:
    """The CI legs `merge` expects when `--expect-legs` is not given."""
    return matrix_dir() / "legs.toml"


def default_pytest_ini() -> Path:
    """The pytest settings of a matrix run whose matrix has no `pytest.ini` beside it."""
    return matrix_dir() / "pytest.ini"
