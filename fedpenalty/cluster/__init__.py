"""Launchers that start owner hosts outside the coordinator's process (``local``: owner-host
processes on loopback gRPC)."""
