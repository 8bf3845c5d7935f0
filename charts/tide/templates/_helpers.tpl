{{/* The chart's name, or nameOverride. */}}
{{- define "tide.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object's name: fullnameOverride, else the release name when it already
holds the chart's name ("tide"), else "<release>-<chart>". Kept short enough for the suffixes. */}}
{{- define "tide.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The engine's objects: Deployment, Service, ServiceAccount, ClusterRole and its binding. */}}
{{- define "tide.engine" -}}
{{- printf "%s-engine" (include "tide.fullname" .) }}
{{- end }}

{{/* The Lease the replicas elect their leader on (the Role grants get/update on it alone). */}}
{{- define "tide.leaseName" -}}
{{- default (include "tide.engine" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* What selects the engine's pods (the Deployment, the Service, the ServiceMonitor). */}}
{{- define "tide.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-engine" (include "tide.name" .) }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "tide.labels" -}}
{{ include "tide.selectorLabels" . }}
app.kubernetes.io/component: engine
app.kubernetes.io/part-of: tide
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The URL prefix Volcano's extender plugin posts to: the Service, in-cluster. */}}
{{- define "tide.extenderUrl" -}}
{{- printf "http://%s.%s.svc:%v/extender" (include "tide.engine" .) .Release.Namespace .Values.port }}
{{- end }}

{{/* files/volcano-scheduler.conf with its urlPrefix pointing at this release's Service. The file
names the base's Service (manifests/deploy/), so it can be used as it is with that base. */}}
{{- define "tide.volcanoSchedulerConf" -}}
{{- .Files.Get "files/volcano-scheduler.conf" | replace "http://tide-engine.tide-system.svc:8080/extender" (include "tide.extenderUrl" .) }}
{{- end }}
