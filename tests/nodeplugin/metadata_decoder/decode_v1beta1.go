//go:build metadata_v1beta1

package main

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

// The 1.37 library validates what it decodes on request and says which version it used.
func decodeStream(d *json.Decoder, dm *metadata.DeviceMetadata, validation *error, gvk *schema.GroupVersionKind) error {
	return devicemetadata.DecodeMetadataFromStream(d, dm,
		devicemetadata.DecodeMetadataWithValidationResult(validation),
		devicemetadata.DecodeMetadataStoreGVKResult(gvk))
}
