"""Code shared by the controller, the kubelet plugin and the tooling."""
