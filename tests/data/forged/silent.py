"""Broken payload: prints nothing at all and exits 0."""
