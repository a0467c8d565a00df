#!/usr/bin/env bash
# End-to-end check of neuron-dra on a local kind cluster (no Neuron hardware needed).
#
# Creates a two-node kind cluster (Kubernetes 1.34: DRA's resource.k8s.io/v1 is on by default),
# builds the image and loads it into the nodes, installs the chart with the kubelet plugin in
# emulation mode (every worker pretends to be an EMULATE instance) with
# examples/scripts/install-dra-driver.sh, then runs examples/scripts/smoke-test.sh: a pod whose
# claim asks for four connected Neuron devices runs with four /dev/neuron* nodes and
# NEURON_RT_VISIBLE_CORES set, and its claim is unprepared when it goes. The install script
# and the smoke test are the steps CI runs on real nodes (tests/chart/test_installed_product.py);
# this script adds only what kind needs. The cluster is deleted on exit unless KEEP_CLUSTER=1.
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

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { printf '\n=== %s\n' "$*"; }
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
# Read whole, then searched: a pipe into `grep -q` fails under pipefail when grep exits first.
api_versions=$(kubectl api-versions) || die "kubectl api-versions failed"
grep -qx resource.k8s.io/v1 <<<"$api_versions" || die "the cluster does not serve resource.k8s.io/v1"

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

# The same steps as every installed cluster's check, the project's real-node tests' included
# (tests/chart/test_installed_product.py): examples/scripts/smoke-test.sh.
say "smoke test: a pod with four connected Neuron devices"
"$repo_root/examples/scripts/smoke-test.sh" --timeout "$TIMEOUT"

say "PASSED"
