#!/usr/bin/env bash
# Install (or upgrade) the neuron-dra Neuron DRA driver and UltraServer controller into the
# cluster of the current kubectl context, from this checkout's Helm chart.
#
# Usage: examples/scripts/install-dra-driver.sh [options] <image uri>
#
#   <image uri>   the neuron-dra image to run, REGISTRY/REPOSITORY:TAG, e.g.
#                 123456789012.dkr.ecr.us-west-2.amazonaws.com/neuron-dra:0.1.0
#                 (build and push it with: hack/build-image <repository> <tag> --push)
#
# Options:
#   --emulation TYPE    run the kubelet plugin in emulation mode as instance type TYPE (e.g.
#                       trn2.48xlarge) on every node: for test clusters without Neuron hardware
#   --no-controller     do not install the UltraServer controller (single-node claims only)
#   --namespace NS      release namespace (default neuron-dra-driver)
#   --release NAME      Helm release name (default neuron-dra-driver)
#   -f, --values FILE   extra Helm values file (repeatable)
#   --set KEY=VALUE     extra Helm value (repeatable)
#   --timeout DURATION  how long to wait for the pods to become ready (default 5m)
#   --force             install even if nodes still advertise Neuron device plugin resources
#   -y, --yes           do not ask to confirm the kubectl context
#   --dry-run           run the checks, then print the commands instead of changing anything
#   -h, --help          this text
#
# Steps: check the tools and the cluster (Kubernetes 1.34+, resource.k8s.io/v1 served, no
# Neuron device plugin on the nodes), apply the CRDs, create the namespace with the Pod
# Security level the plugin needs, `helm upgrade --install` the chart and wait for the pods,
# then show the DeviceClasses and the ResourceSlices the plugins published.
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

die() {
  echo "install-dra-driver: error: $*" >&2
  exit 1
}

note() {
  echo "install-dra-driver: $*"
}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/../.." && pwd)
chart=${CHART:-$repo_root/charts/neuron-dra-driver}

namespace=neuron-dra-driver
release=neuron-dra-driver
timeout=5m
emulation=""
controller=true
force=false
assume_yes=false
dry_run=false
image_uri=""
helm_values=()

while (($#)); do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --emulation | --namespace | --release | --timeout | --set | -f | --values)
      (($# >= 2)) || die "$1 needs a value (see --help)"
      case "$1" in
        --emulation) emulation=$2 ;;
        --namespace) namespace=$2 ;;
        --release) release=$2 ;;
        --timeout) timeout=$2 ;;
        --set) helm_values+=(--set "$2") ;;
        -f | --values) helm_values+=(--values "$2") ;;
      esac
      shift
      ;;
    --no-controller) controller=false ;;
    --force) force=true ;;
    -y | --yes) assume_yes=true ;;
    --dry-run) dry_run=true ;;
    -*) die "unknown option $1 (see --help)" ;;
    *)
      [[ -z $image_uri ]] || die "more than one image uri given: $image_uri, $1"
      image_uri=$1
      ;;
  esac
  shift
done

if [[ -z $image_uri ]]; then
  usage >&2
  die "missing <image uri>"
fi

# --- the image uri -------------------------------------------------------------------------
# REGISTRY[:PORT]/REPOSITORY:TAG. The tag is what follows the last ':' after the last '/', so
# a registry port is not mistaken for a tag.
[[ $image_uri != *@* ]] || die "image digests are not supported by the chart's values; \
use a tag (REPOSITORY:TAG): $image_uri"
last_part=${image_uri##*/}
if [[ $last_part == *:* ]]; then
  image_repository=${image_uri%:*}
  image_tag=${image_uri##*:}
else
  die "the image uri has no tag: $image_uri (expected REPOSITORY:TAG, e.g. \
123456789012.dkr.ecr.us-west-2.amazonaws.com/neuron-dra:0.1.0)"
fi
[[ -n $image_repository && -n $image_tag ]] || die "cannot parse image uri: $image_uri"

# --- tools ---------------------------------------------------------------------------------
for tool in kubectl helm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    case "$tool" in
      kubectl) die "kubectl not found on PATH; install it: https://kubernetes.io/docs/tasks/tools/" ;;
      helm) die "helm (v3) not found on PATH; install it: https://helm.sh/docs/intro/install/" ;;
    esac
  fi
done
[[ -f $chart/Chart.yaml ]] || die "chart not found at $chart (set CHART=/path/to/neuron-dra-driver)"

# --- the cluster ---------------------------------------------------------------------------
context=$(kubectl config current-context 2>/dev/null) ||
  die "kubectl has no current context; point it at your cluster first (kubectl config use-context ...)"
note "kubectl context: $context"
if ! $assume_yes && ! $dry_run && [[ -t 0 ]]; then
  read -r -p "Install neuron-dra ($image_uri) into this cluster? [y/N] " answer
  [[ $answer == [yY]* ]] || die "cancelled"
fi

version_json=$(kubectl version -o json 2>/dev/null) ||
  die "cannot reach the API server of context $context (kubectl version failed)"
server_minor=$(printf '%s\n' "$version_json" |
  sed -n '/"serverVersion"/,/}/s/.*"minor": *"\([0-9]*\).*/\1/p' | head -n 1)
server_major=$(printf '%s\n' "$version_json" |
  sed -n '/"serverVersion"/,/}/s/.*"major": *"\([0-9]*\).*/\1/p' | head -n 1)
if [[ -n $server_major && -n $server_minor ]]; then
  if ((server_major == 1 && server_minor < 34)); then
    die "the cluster runs Kubernetes $server_major.$server_minor; neuron-dra needs 1.34 or newer \
(resource.k8s.io/v1)"
  fi
  note "Kubernetes $server_major.$server_minor"
  if ((server_major == 1 && server_minor < 36)); then
    note "note: pods asking aws.amazon.com/neuron in resources.limits (device-plugin pod specs) \
need Kubernetes 1.36+ to be served by this driver; here they stay Pending. Use ResourceClaims"
  fi
else
  note "warning: could not read the server version; continuing"
fi
# Read the whole list before searching it: `kubectl api-versions | grep -q` under pipefail
# fails whenever grep exits at the match while kubectl is still writing (SIGPIPE).
api_versions=$(kubectl api-versions) ||
  die "cannot list the API server's API versions (kubectl api-versions failed)"
if ! grep -qx 'resource.k8s.io/v1' <<<"$api_versions"; then
  die "the API server does not serve resource.k8s.io/v1 (Dynamic Resource Allocation); \
neuron-dra needs Kubernetes 1.34+ with DRA enabled"
fi

# A node cannot be served by both the device plugin and the DRA driver.
device_plugin_nodes=$(kubectl get nodes -o \
  jsonpath='{range .items[*]}{.metadata.name}{"\t"}{.status.allocatable.aws\.amazon\.com/neuron}{"\t"}{.status.allocatable.aws\.amazon\.com/neuroncore}{"\n"}{end}' |
  awk -F '\t' '($2 != "" && $2 != "0") || ($3 != "" && $3 != "0") {print $1}')
# Its DaemonSet, too: nodes that have not advertised yet (new nodes, a plugin restarting)
# would be served by both as soon as it does.
device_plugin_sets=$(kubectl get daemonsets -A \
  -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}' 2>/dev/null |
  grep -E '(^|/)neuron-device-plugin' || true)
if [[ -n $device_plugin_sets && -z $device_plugin_nodes ]]; then
  device_plugin_nodes="(none advertises yet; DaemonSet $(tr '\n' ' ' <<<"$device_plugin_sets"))"
fi
if [[ -n $device_plugin_nodes ]]; then
  msg="these nodes advertise aws.amazon.com/neuron or neuroncore, so the Neuron device plugin
runs on them:
$(sed 's/^/  /' <<<"$device_plugin_nodes")
The device plugin and the DRA driver cannot serve the same node. Remove the device plugin
from these nodes first (e.g. helm upgrade <release> oci://public.ecr.aws/neuron/neuron-helm-chart
--set devicePlugin.enabled=false), or re-run with --force."
  if $force; then
    note "warning: $msg"
  else
    die "$msg"
  fi
fi

# --- install -------------------------------------------------------------------------------
run() {
  if $dry_run; then
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

helm_args=(
  upgrade --install "$release" "$chart"
  --namespace "$namespace"
  --set-string "image.repository=$image_repository"
  --set-string "image.tag=$image_tag"
  --set "controller.enabled=$controller"
  --wait --timeout "$timeout"
)
if [[ -n $emulation ]]; then
  helm_args+=(--set kubeletPlugin.emulation.enabled=true
    --set-string "kubeletPlugin.emulation.instanceType=$emulation")
fi
# ${a[@]+...}: bash 3.2 (macOS) treats an empty array as unset under `set -u`.
helm_args+=(${helm_values[@]+"${helm_values[@]}"})

# Helm installs CRDs on the first install only and never upgrades them, so apply them here
# (server-side: the CRDs are larger than the client-side apply annotation allows).
note "applying the CRDs"
run kubectl apply --server-side --force-conflicts -f "$chart/crds/"

# The plugin mounts host paths, which the Pod Security "baseline" and "restricted" levels
# forbid: the namespace must allow "privileged".
note "preparing namespace $namespace"
if $dry_run || ! kubectl get namespace "$namespace" >/dev/null 2>&1; then
  run kubectl create namespace "$namespace"
fi
run kubectl label namespace "$namespace" --overwrite \
  pod-security.kubernetes.io/enforce=privileged

note "installing release $release (image $image_repository:$image_tag${emulation:+, emulating $emulation})"
run helm "${helm_args[@]}"

if $dry_run; then
  note "dry run: nothing was changed"
  exit 0
fi

# --- show the result -----------------------------------------------------------------------
echo
kubectl get pods --namespace "$namespace" -o wide
echo
kubectl get deviceclasses
echo
slices=$(kubectl get resourceslices --field-selector spec.driver=neuron.aws.com --no-headers 2>/dev/null | wc -l | tr -d ' ')
if ((slices == 0)); then
  note "no Neuron ResourceSlices yet: the plugin publishes one per Neuron node (instance types
in kubeletPlugin.instanceTypes of the chart, or every node with --emulation). Check:
  kubectl get daemonset --namespace $namespace
  kubectl logs --namespace $namespace -l app.kubernetes.io/component=kubelet-plugin"
else
  kubectl get resourceslices --field-selector spec.driver=neuron.aws.com
fi
if $controller; then
  echo
  kubectl get neuronultraservers --namespace "$namespace" 2>/dev/null || true
fi

cat <<EOF

neuron-dra is installed. Try it:
  kubectl apply -f $repo_root/examples/specs/connected-4-devices.yaml    # a ResourceClaimTemplate
  neuron-dra check-claim -f $repo_root/examples/specs/connected-4-devices.yaml --kubeconfig ~/.kube/config
The README has the templates for connected devices, LNC and UltraServers.
EOF
