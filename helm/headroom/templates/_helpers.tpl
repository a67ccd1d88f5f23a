{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "headroom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "headroom.fullname" -}}
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

{{- define "headroom.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "headroom.selectorLabels" -}}
app.kubernetes.io/name: {{ include "headroom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "headroom.labels" -}}
helm.sh/chart: {{ include "headroom.chart" . }}
{{ include "headroom.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: headroom
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end -}}
{{- end -}}

{{- define "headroom.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "headroom.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Workload name of shard (dict "root" $ "shard" i): the full name alone without sharding. */}}
{{- define "headroom.shardName" -}}
{{- $root := .root -}}
{{- if gt (int $root.Values.sharding.shards) 1 -}}
{{- printf "%s-shard-%d" (include "headroom.fullname" $root | trunc 44 | trimSuffix "-") (int .shard) -}}
{{- else -}}
{{- include "headroom.fullname" $root | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "headroom.image" -}}
{{- $img := .Values.image -}}
{{- $repo := ternary (printf "%s/%s" $img.registry $img.repository) $img.repository (ne $img.registry "") -}}
{{- if $img.digest -}}
{{- printf "%s:%s@%s" $repo (default .Chart.AppVersion $img.tag) $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* StatefulSet (a claim per pod) when persistence is on without an existing claim, else Deployment. */}}
{{- define "headroom.workloadKind" -}}
{{- if and .Values.persistence.enabled (not .Values.persistence.existingClaim) -}}
StatefulSet
{{- else -}}
Deployment
{{- end -}}
{{- end -}}

{{/* Object name for a file in files/: lower-case DNS label from the base name without extension. */}}
{{- define "headroom.fileObjectName" -}}
{{- $base := base .path | trimSuffix ".json" | trimSuffix ".yaml" | trimSuffix ".yml" -}}
{{- $clean := regexReplaceAll "[^a-z0-9-]+" (lower $base) "-" | trimAll "-" | trimPrefix "headroom-" -}}
{{- printf "%s-%s" (include "headroom.fullname" .root | trunc 30 | trimSuffix "-") ($clean | trunc 32 | trimSuffix "-") -}}
{{- end -}}
