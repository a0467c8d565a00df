#!/usr/bin/env bash
# After install: prove that neuron-dra serves Neuron devices to a pod, on any cluster
# (EKS, kind with emulation, the project's real-node tests).
#
# Usage: examples/scripts/smoke-test.sh [options]
#
#   --devices N         connected devices the pod asks for (default 4; 1, 2, 4, 8 or 16 as
#                       the instance type has groups of)
#   --image IMAGE       the pod's image: anything with sh, env, ls and grep
#                       (default public.ecr.aws/docker/library/busybox:1.36)
#   --namespace NS      a namespace of its own, created and deleted (default neuron-dra-smoke)
#   --timeout SECONDS   how long each step may take (default 180)
#   --keep              leave the namespace, claim and pod in place
#   -h, --help          this text
#
# Steps: wait for a ResourceSlice of the driver; create a ResourceClaimTemplate of N connected
# devices (the devicegroupN_id constraint) and a pod using it; check inside the container:
# N /dev/neuron* device nodes and NEURON_RT_VISIBLE_CORES set; delete the pod and wait until
# its claim is gone (the plugin unprepared it). Exit 1 with the cluster's state on failure.
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}
die() {
  echo "smoke-test: error: $*" >&2
  exit 1
}
say() { printf '\n=== %s\n' "$*"; }

devices=4
image=public.ecr.aws/docker/library/busybox:1.36
namespace=neuron-dra-smoke
timeout=180
keep=false
while (($#)); do
  case "$1" in
    --devices) devices=$2; shift ;;
    --image) image=$2; shift ;;
    --namespace) namespace=$2; shift ;;
    --timeout) timeout=$2; shift ;;
    --keep) keep=true ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
[[ $devices =~ ^(1|2|4|8|16)$ ]] || die "--devices must be 1, 2, 4, 8 or 16, got $devices"
[[ $timeout =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds, got $timeout"
command -v kubectl >/dev/null 2>&1 || die "kubectl not found on PATH"

# wait_until DESCRIPTION COMMAND...: run COMMAND every 2 s until it succeeds or the timeout.
wait_until() {
  local what=$1 deadline=$((SECONDS + timeout))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${timeout}s waiting for $what"
    sleep 2
  done
}

cleanup() {
  local rc=$?
  if ((rc != 0)); then
    echo "smoke-test: FAILED (exit $rc); state at the time:" >&2
    kubectl get pods,resourceclaims -n "$namespace" -o wide >&2 || true
    kubectl describe pod -n "$namespace" >&2 || true
    kubectl get resourceslices --field-selector spec.driver=neuron.aws.com >&2 || true
  fi
  if ! $keep; then
    kubectl delete namespace "$namespace" --wait=false >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT

say "a ResourceSlice of neuron.aws.com"
# The names are read whole, then tested: piping into `grep -q` would fail under pipefail when
# grep exits before kubectl has written them all.
has_slice() {
  local names
  names=$(kubectl get resourceslices --field-selector spec.driver=neuron.aws.com -o name) &&
    [[ -n $names ]]
}
wait_until "a ResourceSlice of neuron.aws.com (is the plugin running on a Neuron node?)" has_slice

say "a pod with $devices connected Neuron devices"
kubectl create namespace "$namespace" >/dev/null
constraint=""
if ((devices > 1)); then
  constraint="
      constraints:
      - requests: [neurons]
        matchAttribute: resource.aws.com/devicegroup${devices}_id"
fi
kubectl apply -n "$namespace" -f - <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: smoke-neurons
spec:
  spec:
    devices:
      requests:
      - name: neurons
        exactly:
          deviceClassName: neuron.aws.com
          allocationMode: ExactCount
          count: $devices$constraint
---
apiVersion: v1
kind: Pod
metadata:
  name: smoke
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: smoke
    image: $image
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    resources:
      claims:
      - name: neurons
  resourceClaims:
  - name: neurons
    resourceClaimTemplateName: smoke-neurons
EOF
kubectl wait -n "$namespace" --for=condition=Ready pod/smoke --timeout "${timeout}s"

say "the claim"
kubectl get resourceclaims -n "$namespace" -o jsonpath='{range .items[*].status.allocation.devices.results[*]}{.pool}{" "}{.device}{"\n"}{end}'

say "inside the container"
inside=$(kubectl exec -n "$namespace" smoke -- sh -c 'env | grep ^NEURON_ | sort; ls /dev | grep -c "^neuron[0-9]"')
echo "$inside"
grep -q '^NEURON_RT_VISIBLE_CORES=' <<<"$inside" || die "NEURON_RT_VISIBLE_CORES not set in the container"
seen=$(tail -n 1 <<<"$inside")
[[ $seen == "$devices" ]] || die "expected $devices /dev/neuron* in the container, found $seen"

if $keep; then
  say "PASSED (kept: kubectl delete namespace $namespace)"
  exit 0
fi
say "delete the pod: the plugin unprepares the claim"
kubectl delete -n "$namespace" pod/smoke --wait --timeout "${timeout}s"
no_claims() { [[ -z $(kubectl get resourceclaims -n "$namespace" -o name) ]]; }
wait_until "the pod's ResourceClaim to be deleted" no_claims

say "PASSED"
