"""Chart checks (no helm needed)."""
