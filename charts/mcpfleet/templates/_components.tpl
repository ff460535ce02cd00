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
