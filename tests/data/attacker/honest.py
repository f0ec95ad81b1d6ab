#!/usr/bin/env python3
"""The "before" file of the swap test: runs its payload and attempts nothing against the harness.

tests/integration/test_trust_attacks.py puts this script at a spec's wrapper path, takes the
backend's identity, then replaces it with wrapper.py at the same path: a backend identity
that pins its executables by digest must tell the two apart. (Neither confines anything.)
"""

import os
import sys

if __name__ == "__main__":
    os.execvp(sys.argv[1], sys.argv[1:])  # noqa: S606  (the payload argv, no shell wanted)
