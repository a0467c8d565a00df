//go:build !metadata_v1beta1

package main

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

// The 1.36 library takes no options; v1alpha1 is the only version it knows.
func decodeStream(d *json.Decoder, dm *metadata.DeviceMetadata, _ *error, gvk *schema.GroupVersionKind) error {
	*gvk = v1alpha1.SchemeGroupVersion.WithKind("DeviceMetadata")
	return devicemetadata.DecodeMetadataFromStream(d, dm)
}
