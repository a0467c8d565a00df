// Reads device metadata files (KEP-5304) with Kubernetes' own decoder
// (k8s.io/dynamic-resource-allocation/devicemetadata) and prints, per file, one JSON line
// with what it decoded, for tests/nodeplugin/test_metadata_upstream.py. Built against the
// module versions a pinned Kubernetes minor uses (hack/k8s/v1.3x/go.mod).
package main

import (
	"encoding/json"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/dynamic-resource-allocation/api/metadata"
)

type device struct {
	Driver     string                                                    `json:"driver"`
	Pool       string                                                    `json:"pool"`
	Name       string                                                    `json:"name"`
	Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute `json:"attributes,omitempty"`
}

type request struct {
	Name    string   `json:"name"`
	Devices []device `json:"devices"`
}

type result struct {
	Path         string         `json:"path"`
	Error        string         `json:"error,omitempty"`
	Validation   string         `json:"validation,omitempty"`
	Version      string         `json:"version,omitempty"`
	Metadata     map[string]any `json:"metadata,omitempty"`
	PodClaimName *string        `json:"podClaimName,omitempty"`
	Requests     []request      `json:"requests,omitempty"`
}

func decode(path string) result {
	out := result{Path: path}
	f, err := os.Open(path)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	defer f.Close()
	var dm metadata.DeviceMetadata
	var validation error
	var gvk schema.GroupVersionKind
	if err := decodeStream(json.NewDecoder(f), &dm, &validation, &gvk); err != nil {
		out.Error = err.Error()
		return out
	}
	if validation != nil {
		out.Validation = validation.Error()
	}
	out.Version = gvk.GroupVersion().String()
	out.Metadata = map[string]any{
		"name": dm.Name, "namespace": dm.Namespace, "uid": string(dm.UID), "generation": dm.Generation,
	}
	out.PodClaimName = dm.PodClaimName
	for _, r := range dm.Requests {
		req := request{Name: r.Name, Devices: []device{}}
		for _, d := range r.Devices {
			req.Devices = append(req.Devices, device{d.Driver, d.Pool, d.Name, d.Attributes})
		}
		out.Requests = append(out.Requests, req)
	}
	return out
}

func main() {
	for _, path := range os.Args[1:] {
		line, err := json.Marshal(decode(path))
		if err != nil {
			panic(err)
		}
		fmt.Println(string(line))
	}
}
