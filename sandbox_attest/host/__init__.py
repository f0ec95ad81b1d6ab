"""The host OS as the harness meets it: users, child processes, safe paths, platform.

It knows no sandbox and no run.

Nothing is imported here, so a process that needs one piece loads only that piece.
"""
