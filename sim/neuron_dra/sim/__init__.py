"""Test and simulation support shipped as a library (fake API server, fixtures)."""
