"""Judged evidence -> the files a person reads.

Evidence, outcomes, JUnit, Allure, SARIF, the views, and the release policy's gate.

Nothing is imported here, so a process that needs one piece loads only that piece.
"""
