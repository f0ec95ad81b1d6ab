"""`python -m sandbox_attest.cli`: the same command as the `sandbox-attest` script."""

from __future__ import annotations

import sys

from sandbox_attest.cli import main

sys.exit(main())
