"""Gang start on the real scheduler (issue 12 item 4): ``hack/bench/gang-start``.

A simulated cluster of trn2u.48xlarge UltraServers (:class:`..simcluster.SimCluster` on a
real control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler; our
controller and one kubelet plugin per node, simulated kubelets calling the plugins over
gRPC). Each run applies, with the real ``kubectl apply -f``, a NeuronUltraServerWorkload
(topologySize 4, serverCount 4) and a Deployment of 16 pods referencing the
ResourceClaimTemplate the controller generates for it (the shape of seed 000's), and times
apply → workload Allocated → template created → every claim allocated by the scheduler →
every pod Prepared (its kubelet's NodePrepareResources returned and the pod was reported
Running), then checks each pod's ranks in its CDI environment and deletes everything.
:mod:`.harness` measures; the figures and the table are plain data here.
"""
