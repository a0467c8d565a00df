"""Our kubelet plugin and the Go peer (``sigs.k8s.io/dra-example-driver``'s kubelet plugin)
side by side on one real control plane (issue 12): ``hack/bench/peer``.

Each plugin runs as its own process for a node of its own, registered the kubelet's way (the
harness plays both nodes' kubelets over the registration and DRA sockets), publishing its
ResourceSlices to the same kube-apiserver; the real kube-scheduler allocates the claims of
pods pinned to each node; the harness then calls NodePrepareResources /
NodeUnprepareResources over gRPC for those claims, alternating between the drivers call by
call so both share the machine's noise. :mod:`.stats` makes the table (pure),
:mod:`.harness` measures.
"""
