{{/*
Named templates shared by the chart. Function use is kept to a small set (include, toYaml,
nindent, quote, default, required, fail, trunc, trimSuffix, contains, printf, dict, list,
int, toString, empty) (a habit from before the chart was checked with the real helm).
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "neuron-dra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Prefix of every resource name: fullnameOverride, else the release name, followed by the
chart name unless the release name already contains it.
*/}}
{{- define "neuron-dra.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Names of the two components' objects (workloads, service accounts, roles). */}}
{{- define "neuron-dra.pluginName" -}}
{{- printf "%s-kubelet-plugin" (include "neuron-dra.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "neuron-dra.controllerName" -}}
{{- printf "%s-controller" (include "neuron-dra.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The user name the API server gives a service account's token. Takes (dict "ctx" . "name" SA). */}}
{{- define "neuron-dra.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .ctx.Release.Namespace .name -}}
{{- end -}}

{{/* Labels on every object. Takes (dict "ctx" . "component" NAME-or-""). */}}
{{- define "neuron-dra.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | trunc 63 | trimSuffix "-" }}
{{ include "neuron-dra.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: neuron-dra
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels that select a component's pods (stable across upgrades). Takes (dict "ctx" . "component" NAME-or-""). */}}
{{- define "neuron-dra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "neuron-dra.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{/* The image reference; the tag defaults to the chart's appVersion. */}}
{{- define "neuron-dra.image" -}}
{{- printf "%s:%s" (required "image.repository is required" .Values.image.repository) (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
