"""Launchers that host owners in local processes or Ray (later issues)."""
