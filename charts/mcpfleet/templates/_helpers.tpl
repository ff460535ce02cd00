{{/* The chart's name, overridable. */}}
{{- define "mcpfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name, short enough that "<fullname>-<component>" (longest
suffix: "-operator-metrics", 17 characters) stays within 63.
*/}}
{{- define "mcpfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 46 | trimSuffix "-" }}
{{- else if contains (include "mcpfleet.name" .) .Release.Name }}
{{- .Release.Name | trunc 46 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "mcpfleet.name" .) | trunc 46 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels of every object; pass (dict "ctx" $ "component" "operator"). */}}
{{- define "mcpfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: mcpfleet
{{ include "mcpfleet.selectorLabels" . }}
{{- with .ctx.Values.commonLabels }}
{{- include "mcpfleet.stringMap" . }}
{{- end }}
{{- end }}

{{/* Labels that select one component's Pods. */}}
{{- define "mcpfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mcpfleet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
An image reference from (dict "image" .Values.x.image "ctx" $):
repository[:tag][@digest]; the tag defaults to the chart's appVersion.
*/}}
{{- define "mcpfleet.imageRef" -}}
{{- $tag := .image.tag | default .ctx.Chart.AppVersion -}}
{{- if .image.digest -}}
{{ .image.repository }}{{ if .image.tag }}:{{ .image.tag }}{{ end }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ $tag }}
{{- end }}
{{- end }}

{{/* The mcpfleet image (replicas, router, operator, the helm test). */}}
{{- define "mcpfleet.image" -}}
{{ include "mcpfleet.imageRef" (dict "image" .Values.image "ctx" .) }}
{{- end }}

{{/*
The replicas' image: server.image, each empty field taken from image (an
image of your own app built on the mcpfleet image).
*/}}
{{- define "mcpfleet.server.image" -}}
{{- $own := .Values.server.image -}}
{{- $image := dict "repository" ($own.repository | default .Values.image.repository) "tag" ($own.tag | default .Values.image.tag) "digest" ($own.digest | default .Values.image.digest) -}}
{{ include "mcpfleet.imageRef" (dict "image" $image "ctx" .) }}
{{- end }}
{{- define "mcpfleet.server.pullPolicy" -}}
{{- .Values.server.image.pullPolicy | default .Values.image.pullPolicy }}
{{- end }}

{{/*
A component's ServiceAccount name (dict "ctx" $ "component" "server"): its
serviceAccount.name, else "<fullname>-<component>" when created, else "default".
*/}}
{{- define "mcpfleet.componentServiceAccountName" -}}
{{- $sa := (index .ctx.Values .component).serviceAccount -}}
{{- if $sa.create -}}
{{- $sa.name | default (printf "%s-%s" (include "mcpfleet.fullname" .ctx) .component) }}
{{- else -}}
{{- $sa.name | default "default" }}
{{- end -}}
{{- end }}

{{/* The operator's kopf peering object: operator.peering.name, else the release's full name. */}}
{{- define "mcpfleet.operator.peeringName" -}}
{{- .Values.operator.peering.name | default (include "mcpfleet.fullname" .) }}
{{- end }}

{{/* Pull secrets of every Pod. */}}
{{- define "mcpfleet.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end }}

{{/* The fleet name: where replicas attest in Redis and what the KeyRing reads. */}}
{{- define "mcpfleet.fleet" -}}
{{- .Values.fleet | default (include "mcpfleet.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "mcpfleet.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "mcpfleet.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The default KeyRing's name, and the Secret holding its ring. */}}
{{- define "mcpfleet.keyRingName" -}}
{{- .Values.keyRing.name | default (printf "%s-keys" (include "mcpfleet.fullname" .)) }}
{{- end }}
{{- define "mcpfleet.keySecretName" -}}
{{- .Values.keyRing.secretName | default (include "mcpfleet.keyRingName" .) }}
{{- end }}

{{/* The Redis URL every component uses (never holds a password). */}}
{{- define "mcpfleet.redisURL" -}}
{{- if .Values.redis.enabled -}}
redis://{{ include "mcpfleet.fullname" . }}-redis:{{ .Values.redis.port }}/0
{{- else -}}
{{ required "redis.enabled=false needs redis.external.url" .Values.redis.external.url }}
{{- end }}
{{- end }}

{{/*
The Redis flags of one component (dict "ctx" $ "component" "replica"): the URL
(with the component's user name when auth is on), and the password and TLS
files mounted by "mcpfleet.redisVolumeMounts". Nothing secret is an argument.
*/}}
{{- define "mcpfleet.redisArgs" -}}
{{- $ctx := .ctx -}}
{{- $url := include "mcpfleet.redisURL" $ctx -}}
{{- if and $ctx.Values.redis.enabled $ctx.Values.redis.auth.enabled -}}
{{- $url = printf "redis://%s@%s-redis:%v/0" .component (include "mcpfleet.fullname" $ctx) $ctx.Values.redis.port -}}
{{- else if not $ctx.Values.redis.enabled -}}
{{- with (index $ctx.Values.redis.external.users .component).username -}}
{{- /* This component's own user replaces the URL's. */}}
{{- $url = regexReplaceAll "^([a-z+]+://)([^@/]*@)?" $url (printf "${1}%s@" .) -}}
{{- end -}}
{{- end }}
- --redis={{ $url }}
{{- if include "mcpfleet.redisPasswordSecret" . }}
- --redis-password-file=/etc/mcpfleet/redis/password
{{- end }}
{{- if and (not $ctx.Values.redis.enabled) $ctx.Values.redis.external.tls.enabled }}
{{- with $ctx.Values.redis.external.tls }}
{{- if .caSecret }}
- --redis-ca-file=/etc/mcpfleet/redis-tls/{{ .caKey }}
{{- end }}
{{- if .certSecret }}
- --redis-cert-file=/etc/mcpfleet/redis-tls-client/{{ .certKey }}
- --redis-key-file=/etc/mcpfleet/redis-tls-client/{{ .keyKey }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* "name/key" of the Secret holding one component's Redis password, or empty. */}}
{{- define "mcpfleet.redisPasswordSecret" -}}
{{- $ctx := .ctx -}}
{{- $user := index $ctx.Values.redis.external.users .component -}}
{{- if $ctx.Values.redis.enabled -}}
{{- if $ctx.Values.redis.auth.enabled -}}
{{ $ctx.Values.redis.auth.existingSecret | default (printf "%s-redis-auth" (include "mcpfleet.fullname" $ctx)) }}/{{ .component }}
{{- end -}}
{{- else if $user.username -}}
{{- if $user.passwordSecret.name -}}
{{ $user.passwordSecret.name }}/{{ $user.passwordSecret.key }}
{{- end -}}
{{- else if $ctx.Values.redis.external.passwordSecret.name -}}
{{ $ctx.Values.redis.external.passwordSecret.name }}/{{ $ctx.Values.redis.external.passwordSecret.key }}
{{- end -}}
{{- end }}

{{/*
The TCP ports of an external Redis, as a JSON list: redis.external.ports, or
from the URL: its port (6379 without one); for a Sentinel URL every
sentinel's port (26379 without one) and 6379, where the master and replicas
the sentinels name listen; for a Redis Cluster URL every seed node's port
(6379 without one) and 6379, where the nodes the slot map names usually
listen (other ports: redis.external.ports). A unix:// socket needs none.
*/}}
{{- define "mcpfleet.redis.externalPorts" -}}
{{- $ext := .Values.redis.external -}}
{{- $ports := list -}}
{{- if $ext.ports -}}
{{- $ports = $ext.ports -}}
{{- else if not (hasPrefix "unix://" $ext.url) -}}
{{- $sentinel := regexMatch "^[a-z]+\\+sentinel://" $ext.url -}}
{{- $hosts := regexReplaceAll "^[a-z+]+://([^@/]*@)?" $ext.url "" | splitList "/" | first -}}
{{- range splitList "," $hosts -}}
{{- $port := regexFind ":[0-9]+$" . | trimPrefix ":" -}}
{{- $ports = append $ports ($port | default (ternary "26379" "6379" $sentinel) | int) -}}
{{- end -}}
{{- if or $sentinel (regexMatch "^[a-z]+\\+cluster://" $ext.url) -}}
{{- $ports = append $ports 6379 -}}
{{- end -}}
{{- end -}}
{{- $ports | uniq | toJson -}}
{{- end }}

{{/* Volume mounts for a component's Redis password and TLS files. */}}
{{- define "mcpfleet.redisVolumeMounts" -}}
{{- $ctx := .ctx -}}
{{- if include "mcpfleet.redisPasswordSecret" . }}
- name: redis-password
  mountPath: /etc/mcpfleet/redis
  readOnly: true
{{- end }}
{{- if and (not $ctx.Values.redis.enabled) $ctx.Values.redis.external.tls.enabled }}
{{- if $ctx.Values.redis.external.tls.caSecret }}
- name: redis-tls
  mountPath: /etc/mcpfleet/redis-tls
  readOnly: true
{{- end }}
{{- if $ctx.Values.redis.external.tls.certSecret }}
- name: redis-tls-client
  mountPath: /etc/mcpfleet/redis-tls-client
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{/* The volumes behind "mcpfleet.redisVolumeMounts": only this component's password. */}}
{{- define "mcpfleet.redisVolumes" -}}
{{- $ctx := .ctx -}}
{{- with include "mcpfleet.redisPasswordSecret" . }}
{{- $parts := splitList "/" . }}
- name: redis-password
  secret:
    secretName: {{ index $parts 0 }}
    defaultMode: 0440
    items:
      - key: {{ index $parts 1 }}
        path: password
{{- end }}
{{- if and (not $ctx.Values.redis.enabled) $ctx.Values.redis.external.tls.enabled }}
{{- with $ctx.Values.redis.external.tls }}
{{- if .caSecret }}
- name: redis-tls
  secret:
    secretName: {{ .caSecret }}
    defaultMode: 0440
{{- end }}
{{- if .certSecret }}
- name: redis-tls-client
  secret:
    secretName: {{ .certSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The restricted Pod security context (values: podSecurityContext). */}}
{{- define "mcpfleet.podSecurityContext" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* The restricted container security context (values: securityContext). */}}
{{- define "mcpfleet.securityContext" -}}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
{{- end }}

{{/* Host names the router answers: its Service's names, localhost (port-forward), Ingress hosts, extras. */}}
{{- define "mcpfleet.router.allowedHosts" -}}
{{- $svc := printf "%s-router" (include "mcpfleet.fullname" .) -}}
{{- $ns := .Release.Namespace -}}
{{- $hosts := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) "localhost" "127.0.0.1" -}}
{{- if .Values.router.ingress.enabled }}
{{- range .Values.router.ingress.hosts }}
{{- $hosts = append $hosts .host }}
{{- end }}
{{- end }}
{{- range $hosts }}
- --allowed-host={{ . }}
- --allowed-host={{ . }}:*
{{- end }}
{{- range .Values.router.allowedHosts }}
- --allowed-host={{ . }}
{{- end }}
{{- range .Values.router.allowedOrigins }}
- --allowed-origin={{ . }}
{{- end }}
{{- end }}

{{/*
Proxies in front of the router whose X-Forwarded-For entries the replicas trust
(server.limits.trustedProxyHops). Unset (null), the chart counts them: the
Ingress it makes is one proxy hop (every ingress controller appends the address
it received the request from), so 1 with router.ingress on and 0 without.
Counting a hop that is not there would let a client choose its own principal;
not counting one that is makes every user behind it one principal.
*/}}
{{- define "mcpfleet.trustedProxyHops" -}}
{{- $hops := .Values.server.limits.trustedProxyHops -}}
{{- if kindIs "invalid" $hops -}}
{{- if and .Values.router.enabled .Values.router.ingress.enabled }}1{{ else }}0{{ end -}}
{{- else -}}
{{- int $hops -}}
{{- end -}}
{{- end }}

{{/*
A map of labels or annotations, every value a string: `--set
server.podAnnotations.revision=2` gives the number 2, which the API refuses
in an annotation (and a label); here it is rendered "2".
*/}}
{{- define "mcpfleet.stringMap" -}}
{{- range $key, $value := . }}
{{ $key | quote }}: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/*
The OpenTelemetry environment of a component's container (tracing.*), or nothing
when no endpoint is set; pass (dict "ctx" $ "component" "server"). Its Pod's name
names the instance: service.instance.id and k8s.pod.name.
*/}}
{{- define "mcpfleet.tracingEnv" -}}
{{- $t := .ctx.Values.tracing }}
{{- if $t.otlpEndpoint }}
- name: OTEL_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $t.otlpEndpoint | quote }}
- name: OTEL_TRACES_SAMPLER
  value: parentbased_traceidratio
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $t.sampleRatio | quote }}
- name: OTEL_SERVICE_NAME
  value: mcpfleet-{{ ternary "replica" .component (eq .component "server") }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ $attrs := list "service.instance.id=$(OTEL_POD_NAME)" "k8s.pod.name=$(OTEL_POD_NAME)" (printf "k8s.namespace.name=%s" .ctx.Release.Namespace) }}{{ range $k, $v := $t.resourceAttributes }}{{ $attrs = append $attrs (printf "%s=%s" $k $v) }}{{ end }}{{ join "," $attrs | quote }}
- name: MCPFLEET_TRACES_IDENTITY
  value: {{ $t.identity | default "keep" | quote }}
{{- end }}
{{- end }}
