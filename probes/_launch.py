"""Start a probe after the host has looked at this process: `python main.py PROBE TASK`.

The runner stages this file as `main.py`, the probe as `job.py` and the task as `config.json`
in the cell's input directory (sandbox_attest/payload.py), so nothing a wrapper sees in this
command line says it is under test; the host finds the payload by that shape.

The rendezvous (sandbox_attest/run/hostview.py): write `.kiln-lock-<nonce>` into the
workspace, wait for `.kiln-sync-<nonce>` (at most task["rendezvous_s"] seconds; 0
skips the wait where the host cannot look), remove both, then run PROBE as __main__ with
TASK as its argument. While this process waits, the host reads its namespaces, credentials,
routes and mounts from /proc, which no wrapper can rewrite. Nothing is printed here: the
probe's own start marker and report follow as before.

Stdlib only, Python 3.8+, never imported by the host.
"""

import json
import os
import runpy
import sys
import time

# The rendezvous files' prefixes: sandbox_attest/host/disguise.py READY_PREFIX and GO_PREFIX (this
# file imports nothing of the harness; tests/unit/test_disguise.py checks they agree).
READY_PREFIX = ".kiln-lock-"
GO_PREFIX = ".kiln-sync-"


def rendezvous(task_path):
    try:
        with open(task_path) as fh:
            task = json.load(fh)
        wait = float(task.get("rendezvous_s", 0))
        workspace, nonce = task["workspace"], str(task["nonce"])
    except Exception:  # the probe reads the task itself and reports what is wrong
        return
    if wait <= 0:
        return
    ready = os.path.join(workspace, READY_PREFIX + nonce)
    go = os.path.join(workspace, GO_PREFIX + nonce)
    try:
        with open(ready, "w") as fh:
            fh.write(str(os.getpid()))
    except OSError:
        return  # no writable workspace: the host cannot be told; go on unseen
    deadline = time.monotonic() + wait
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.005)
    for path in (ready, go):
        try:
            os.unlink(path)
        except OSError:
            pass


def main(argv):
    probe, task_path = argv[1], argv[2]
    rendezvous(task_path)
    sys.argv = [probe, task_path]
    runpy.run_path(probe, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
