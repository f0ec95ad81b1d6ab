"""One run: matrix -> cells -> judged evidence (set-up, session, runner, host view, sweep).

Nothing is imported here, so a process that needs one piece loads only that piece.
"""
