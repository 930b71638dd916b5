{{/* Names and labels, once (the same as manifests/base's). */}}

{{/* The operator's name: its Deployment, ServiceAccount, Roles and bindings. */}}
{{- define "frota.fullname" -}}
{{- .Values.fullnameOverride | default "frota-operator" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The operator's namespace: namespaceOverride, else the release's. */}}
{{- define "frota.namespace" -}}
{{- .Values.namespaceOverride | default .Release.Namespace -}}
{{- end -}}

{{/* The labels that select the operator's pods (stable: a Deployment's selector is immutable). */}}
{{- define "frota.selectorLabels" -}}
app.kubernetes.io/name: frota
app.kubernetes.io/component: operator
{{- end -}}

{{/* The labels of every object: kustomize's part-of, and commonLabels. */}}
{{- define "frota.commonLabels" -}}
app.kubernetes.io/part-of: frota
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The labels of the operator's own objects. */}}
{{- define "frota.labels" -}}
{{ include "frota.selectorLabels" . }}
{{ include "frota.commonLabels" . }}
{{- end -}}

{{/* The labels of the monitoring objects (rules, dashboards). */}}
{{- define "frota.monitoringLabels" -}}
app.kubernetes.io/name: frota
app.kubernetes.io/component: monitoring
{{ include "frota.commonLabels" . }}
{{- end -}}

{{- define "frota.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
