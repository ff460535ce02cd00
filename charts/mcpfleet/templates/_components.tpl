{{/*
The objects every workload component has in the same shape, one definition
each; pass (dict "ctx" $ "component" "server"). The component's values are
.Values.<component>; the object is named "<fullname>-<component>".
*/}}

{{/* A HorizontalPodAutoscaler for the component's Deployment (autoscaling.*). */}}
{{- define "mcpfleet.hpa" -}}
{{- $c := .component }}
{{- $as := (index .ctx.Values $c).autoscaling }}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "mcpfleet.fullname" .ctx }}-{{ $c }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "mcpfleet.labels" (dict "ctx" .ctx "component" $c) | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "mcpfleet.fullname" .ctx }}-{{ $c }}
  minReplicas: {{ $as.minReplicas }}
  maxReplicas: {{ $as.maxReplicas }}
  metrics:
    {{- if $as.metrics }}
    {{- toYaml $as.metrics | nindent 4 }}
    {{- else }}
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ $as.targetCPUUtilizationPercentage }}
    {{- end }}
  {{- with $as.behavior }}
  behavior:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* "true" when the replicas scale through KEDA (server.autoscaling.mcp): autoscaling
and its mcp part on, and the cluster serving keda.sh/v1alpha1; else empty. */}}
{{- define "mcpfleet.server.keda" -}}
{{- $as := .Values.server.autoscaling }}
{{- if and $as.enabled $as.mcp.enabled (.Capabilities.APIVersions.Has "keda.sh/v1alpha1") -}}
true
{{- end }}
{{- end }}

{{/* The same for the routers (router.autoscaling.mcp). */}}
{{- define "mcpfleet.router.keda" -}}
{{- $as := .Values.router.autoscaling }}
{{- if and .Values.router.enabled $as.enabled $as.mcp.enabled (.Capabilities.APIVersions.Has "keda.sh/v1alpha1") -}}
true
{{- end }}
{{- end }}

{{/*
A KEDA ScaledObject over a component's Deployment (docs/autoscaling.md): one
Prometheus trigger per signal (dicts of name, query, threshold and metricType:
AverageValue keeps the query's value divided by the replicas under the threshold,
Value grows the replicas in proportion to value / threshold), and a cpu trigger
when .cpu. KEDA makes the HPA, named as the chart's own, with its bounds and the
behavior given.
*/}}
{{- define "mcpfleet.scaledObject" -}}
{{- $c := .component }}
{{- $as := (index .ctx.Values $c).autoscaling }}
{{- $name := printf "%s-%s" (include "mcpfleet.fullname" .ctx) $c }}
{{- if and (not .signals) (not .cpu) }}
{{- fail (printf "%s.autoscaling.mcp: every signal is 0 and cpu is off: nothing to scale on" $c) }}
{{- end }}
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ $name }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "mcpfleet.labels" (dict "ctx" .ctx "component" $c) | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $name }}
  minReplicaCount: {{ $as.minReplicas }}
  maxReplicaCount: {{ $as.maxReplicas }}
  pollingInterval: {{ .ctx.Values.server.autoscaling.mcp.pollingInterval }}
  advanced:
    horizontalPodAutoscalerConfig:
      name: {{ $name }}
      {{- with .behavior }}
      behavior:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  triggers:
    {{- range .signals }}
    - type: prometheus
      name: {{ .name }}
      metricType: {{ .metricType | default "AverageValue" }}
      metadata:
        serverAddress: {{ $.ctx.Values.server.autoscaling.mcp.prometheusAddress | quote }}
        query: {{ .query | quote }}
        threshold: {{ printf "%v" (round .threshold 3) | quote }}
        # A series not exported yet (no replica up, an app without tasks) counts 0.
        ignoreNullValues: "true"
    {{- end }}
    {{- if .cpu }}
    - type: cpu
      name: cpu
      metricType: Utilization
      metadata:
        value: {{ $as.targetCPUUtilizationPercentage | quote }}
    {{- end }}
{{- end }}

{{/* Refuses autoscaling.minReplicas above maxReplicas, naming the component. */}}
{{- define "mcpfleet.hpaCheck" -}}
{{- $as := (index .ctx.Values .component).autoscaling }}
{{- if and $as.enabled (gt (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- fail (printf "%s.autoscaling.minReplicas must not exceed %s.autoscaling.maxReplicas" .component .component) }}
{{- end }}
{{- end }}

{{/* A PodDisruptionBudget over the component's Pods: pdb.minAvailable where
set (a component may not offer it), else pdb.maxUnavailable. */}}
{{- define "mcpfleet.pdb" -}}
{{- $c := .component }}
{{- $pdb := (index .ctx.Values $c).pdb }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "mcpfleet.fullname" .ctx }}-{{ $c }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "mcpfleet.labels" (dict "ctx" .ctx "component" $c) | nindent 4 }}
spec:
  {{- if $pdb.minAvailable }}
  minAvailable: {{ $pdb.minAvailable }}
  {{- else }}
  maxUnavailable: {{ $pdb.maxUnavailable }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "mcpfleet.selectorLabels" (dict "ctx" .ctx "component" $c) | nindent 6 }}
{{- end }}

{{/* A workload's own ServiceAccount (e.g. for a cloud workload identity),
whose API token its Pods never mount. */}}
{{- define "mcpfleet.workloadServiceAccount" -}}
{{- $c := .component }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "mcpfleet.componentServiceAccountName" (dict "ctx" .ctx "component" $c) }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "mcpfleet.labels" (dict "ctx" .ctx "component" $c) | nindent 4 }}
  {{- with (index .ctx.Values $c).serviceAccount.annotations }}
  annotations:
    {{- include "mcpfleet.stringMap" . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: false
{{- end }}
