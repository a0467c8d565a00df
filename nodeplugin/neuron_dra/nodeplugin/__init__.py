"""The per-node kubelet DRA plugin."""
