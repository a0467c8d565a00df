#!/usr/bin/env bash
# End-to-end check of neuron-dra on a local kind cluster (no Neuron hardware needed).
#
# Creates a two-node kind cluster (Kubernetes 1.34: DRA's resource.k8s.io/v1 is on by default),
# builds the image and loads it into the nodes, installs the chart with the kubelet plugin in
# emulation mode (every worker pretends to be an EMULATE instance), then runs a pod whose
# ResourceClaimTemplate asks for four connected Neuron devices
# (examples/specs/connected-4-devices.yaml) and checks that it runs with four /dev/neuron*
# nodes and NEURON_RT_VISIBLE_CORES set. The cluster is deleted on exit unless KEEP_CLUSTER=1.
#
# Needs: docker (with a running daemon), kind (v0.33+ for the default node image), kubectl, helm.
#
# Usage: hack/kind-e2e.sh
# Environment:
#   CLUSTER_NAME      kind cluster name (default neuron-dra-e2e)
#   KIND_NODE_IMAGE   node image (default: Kubernetes 1.34.11 as built for kind v0.33.0; use
#                     the 1.34 image listed in your kind release's notes)
#   EMULATE           instance type the worker emulates (default trn2.48xlarge)
#   IMAGE             image to build and load (default neuron-dra:e2e)
#   SKIP_BUILD=1      use IMAGE as it is (already built)
#   KEEP_CLUSTER=1    leave the cluster running at the end (delete it with
#                     kind delete cluster --name $CLUSTER_NAME)
#   TIMEOUT           seconds per wait (default 180)
set -euo pipefail

CLUSTER_NAME=${CLUSTER_NAME:-neuron-dra-e2e}
# Node 1.34.2 or newer: 1.34.0 and 1.34.1 have a DRA regression (kubernetes/kubernetes#133920).
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.34.11@sha256:44e222ee2132dab25ff87301682f89eb82c7880ea3a1bf543bfe9708fd08d67d}
EMULATE=${EMULATE:-trn2.48xlarge}
IMAGE=${IMAGE:-neuron-dra:e2e}
TIMEOUT=${TIMEOUT:-180}
NAMESPACE=neuron-dra-driver
TEST_NAMESPACE=neuron-dra-e2e

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { printf '\n=== %s\n' "$*"; }
# wait_until DESCRIPTION COMMAND...: run COMMAND every 2 s until it succeeds or TIMEOUT passes.
wait_until() {
  local what=$1 deadline=$((SECONDS + TIMEOUT))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${TIMEOUT}s waiting for $what"
    sleep 2
  done
}
die() {
  echo "kind-e2e: error: $*" >&2
  exit 1
}

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found on PATH (this script needs docker, kind, kubectl and helm)"
done
docker info >/dev/null 2>&1 || die "the docker daemon is not reachable ('docker info' fails)"
[[ $IMAGE == *:* ]] || die "IMAGE must be REPOSITORY:TAG, got $IMAGE"
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "TIMEOUT must be a number of seconds, got $TIMEOUT"

kubeconfig=$(mktemp "${TMPDIR:-/tmp}/neuron-dra-e2e-kubeconfig.XXXXXX")
export KUBECONFIG=$kubeconfig

cleanup() {
  local rc=$?
  if ((rc != 0)); then
    echo "kind-e2e: FAILED (exit $rc); state at the time:" >&2
    kubectl get pods -A -o wide >&2 || true
    kubectl get resourceclaims,resourceslices -A >&2 || true
    kubectl describe pod -n "$TEST_NAMESPACE" >&2 || true
    kubectl logs -n "$NAMESPACE" -l app.kubernetes.io/component=kubelet-plugin --tail=50 >&2 || true
  fi
  if [[ ${KEEP_CLUSTER:-} == 1 ]]; then
    echo "kind-e2e: keeping cluster $CLUSTER_NAME (KUBECONFIG=$kubeconfig)"
  else
    kind delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
    rm -f "$kubeconfig"
  fi
  exit "$rc"
}
trap cleanup EXIT

say "kind cluster $CLUSTER_NAME ($KIND_NODE_IMAGE)"
# CDI must be on in containerd (the default since containerd 2.0; the patch covers older node
# images). The control plane keeps its NoSchedule taint, so the plugin runs on the worker only.
kind create cluster --name "$CLUSTER_NAME" --image "$KIND_NODE_IMAGE" --kubeconfig "$kubeconfig" \
  --wait "${TIMEOUT}s" --config - <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
containerdConfigPatches:
- |-
  [plugins."io.containerd.grpc.v1.cri"]
    enable_cdi = true
nodes:
- role: control-plane
- role: worker
EOF
kubectl api-versions | grep -qx resource.k8s.io/v1 || die "the cluster does not serve resource.k8s.io/v1"

if [[ ${SKIP_BUILD:-} == 1 ]]; then
  say "using image $IMAGE as built"
else
  say "build $IMAGE"
  "$repo_root/hack/build-image" "${IMAGE%:*}" "${IMAGE##*:}"
fi
kind load docker-image "$IMAGE" --name "$CLUSTER_NAME"

say "install the chart (emulating $EMULATE)"
"$repo_root/examples/scripts/install-dra-driver.sh" --yes --timeout "${TIMEOUT}s" \
  --emulation "$EMULATE" "$IMAGE"

worker=$(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' \
  -o jsonpath='{.items[0].metadata.name}')
[[ -n $worker ]] || die "no worker node"
say "wait for the ResourceSlice of $worker"
slice_selector="spec.driver=neuron.aws.com,spec.nodeName=$worker"
has_slice() { kubectl get resourceslices --field-selector "$slice_selector" -o name | grep -q .; }
wait_until "the ResourceSlice of $worker" has_slice
kubectl get resourceslices --field-selector spec.driver=neuron.aws.com

# Emulated /dev/neuron<N> are placeholder files on the node; the plugin's CDI specs give them
# to containers as complete character devices (/dev/null's numbers), so no device nodes need
# to exist on the kind node.

say "a pod with four connected Neuron devices"
kubectl create namespace "$TEST_NAMESPACE"
kubectl apply -n "$TEST_NAMESPACE" -f "$repo_root/examples/specs/connected-4-devices.yaml"
kubectl apply -n "$TEST_NAMESPACE" -f - <<'EOF'
apiVersion: v1
kind: Pod
metadata:
  name: pod0
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: ctr0
    image: public.ecr.aws/docker/library/busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    resources:
      claims:
      - name: neurons
  resourceClaims:
  - name: neurons
    resourceClaimTemplateName: 1x4-connected-neurons
EOF
kubectl wait -n "$TEST_NAMESPACE" --for=condition=Ready pod/pod0 --timeout "${TIMEOUT}s"

say "the claim"
kubectl get resourceclaims -n "$TEST_NAMESPACE"
kubectl get resourceclaims -n "$TEST_NAMESPACE" -o jsonpath='{range .items[*].status.allocation.devices.results[*]}{.pool}{" "}{.device}{"\n"}{end}'

say "inside the container"
env_out=$(kubectl exec -n "$TEST_NAMESPACE" pod0 -- sh -c 'env | grep ^NEURON_ | sort; ls /dev | grep -c "^neuron[0-9]"')
echo "$env_out"
grep -q '^NEURON_RT_VISIBLE_CORES=' <<<"$env_out" || die "NEURON_RT_VISIBLE_CORES not set in the container"
[[ $(tail -n 1 <<<"$env_out") == 4 ]] || die "expected 4 /dev/neuron* nodes in the container"

say "delete the pod: the plugin unprepares the claim"
kubectl delete -n "$TEST_NAMESPACE" pod/pod0 --wait --timeout "${TIMEOUT}s"
no_claims() { [[ -z $(kubectl get resourceclaims -n "$TEST_NAMESPACE" -o name) ]]; }
wait_until "the pod's ResourceClaim to be deleted" no_claims

say "PASSED"
