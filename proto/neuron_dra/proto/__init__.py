"""Generated protobuf/gRPC code for the kubelet APIs (see hack/gen-proto)."""
