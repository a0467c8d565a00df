"""Real Kubernetes nodes on this machine: a real kubelet and containerd per node (built from
the pinned modules), Debian's runc, each node in a mount namespace of its own with its own
cgroup root, ports and directories, running real containers from images made without a
registry. :class:`.fleet.RealNodeFleet` starts many; docs/testing.md, "Real nodes", says how
and why.

Parts: :mod:`.layout` (where a node's files are), :mod:`.namespace` (its mount namespace),
:mod:`.configs` (containerd, kubelet and CNI configuration, pure), :mod:`.cgroups`,
:mod:`.images`, :mod:`.node` (one node), :mod:`.fleet` (many, and whether this machine can
run them), :mod:`.podspec` (what a manifest needs to run here, pure).
"""
