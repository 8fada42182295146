{{/*
Shared pieces of the gpulens templates. Each component's workload, Service, ConfigMap and
NetworkPolicy carry the labels app.kubernetes.io/{name,component,part-of}; selectors use the name.
*/}}

{{- define "gpulens.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: gpulens
{{- end }}

{{- define "gpulens.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gpulens.agentImage" -}}
{{ .Values.image.agentRepository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gpulens.checkNamespaces" -}}
{{- if and .Values.namespaces.create (has .Release.Namespace (list .Values.namespaces.main .Values.namespaces.agent)) }}
{{- fail (printf "namespaces.create: the chart creates the namespaces %s and %s, so install the release into another namespace (helm install -n default ...), or set namespaces.create=false and create and label them yourself" .Values.namespaces.main .Values.namespaces.agent) }}
{{- end }}
{{- if eq .Values.namespaces.main .Values.namespaces.agent }}
{{- fail "namespaces.agent: must differ from namespaces.main (the agent needs the privileged Pod Security level, the rest runs under restricted)" }}
{{- end }}
{{- end }}

{{- define "gpulens.saslRequired" -}}
{{- if hasPrefix "SASL" .Values.kafka.securityProtocol }}true{{ end }}
{{- end }}

{{/* The component's Kafka principal (args: root context, Secret name), then extra env. */}}
{{- define "gpulens.kafkaCredentials" -}}
{{- $root := index . 0 }}
{{- $secret := index . 1 }}
{{- $optional := not (include "gpulens.saslRequired" $root) -}}
- name: GPULENS_KAFKA__SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: sasl-username
      optional: {{ $optional }}
- name: GPULENS_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: sasl-password
      optional: {{ $optional }}
{{- end }}

{{- define "gpulens.common" -}}
# Kafka connection (all services)
GPULENS_KAFKA__BOOTSTRAP_SERVERS: {{ .Values.kafka.bootstrapServers | quote }}
# PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL (chart value kafka.securityProtocol); each
# component's SASL credentials come from its own Secret
GPULENS_KAFKA__SECURITY_PROTOCOL: {{ .Values.kafka.securityProtocol | quote }}
{{- with .Values.kafka.saslMechanism }}
GPULENS_KAFKA__SASL_MECHANISM: {{ . | quote }}
{{- end }}
{{- with .Values.kafka.tls.caKey }}
GPULENS_KAFKA__SSL_CA_LOCATION: {{ printf "/etc/gpulens/kafka-tls/%s" . | quote }}
{{- end }}
{{- with .Values.kafka.tls.certificateKey }}
GPULENS_KAFKA__SSL_CERTIFICATE_LOCATION: {{ printf "/etc/gpulens/kafka-tls/%s" . | quote }}
{{- end }}
{{- with .Values.kafka.tls.keyKey }}
GPULENS_KAFKA__SSL_KEY_LOCATION: {{ printf "/etc/gpulens/kafka-tls/%s" . | quote }}
{{- end }}
GPULENS_KAFKA__CLIENT_ID: {{ .Values.kafka.clientId | quote }}
GPULENS_TOPIC_PREFIX: {{ .Values.kafka.topicPrefix | quote }}
GPULENS_DATA_DIR: "/var/lib/gpulens"
GPULENS_LOG_LEVEL: {{ .Values.logLevel | quote }}
GPULENS_LOG_FORMAT: "json"
# Prometheus /metrics of every service (matches the containerPort "metrics", the Services and
# the prometheus.io/port annotations).
GPULENS_METRICS_PORT: {{ .Values.metricsPort | int | quote }}
# ... on every address of the pod, for Prometheus (the setting's default is loopback)
GPULENS_METRICS_ADDR: "0.0.0.0"
{{- end }}

{{- define "gpulens.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metricsPort | int | quote }}
prometheus.io/path: /metrics
{{- end }}

{{/* Pod-level settings of every pod except the agent's: Pod Security "restricted". */}}
{{- define "gpulens.restrictedPod" -}}
enableServiceLinks: false
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{- define "gpulens.containerSecurity" -}}
securityContext:
  privileged: false
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end }}

{{- define "gpulens.metricsPort" -}}
- name: metrics
  containerPort: {{ .Values.metricsPort }}
  protocol: TCP
{{- end }}

{{- define "gpulens.liveness" -}}
livenessProbe:
  httpGet:
    path: /metrics
    port: metrics
  initialDelaySeconds: {{ .delay }}
  periodSeconds: 30
  timeoutSeconds: 5
  failureThreshold: 4
{{- end }}

{{- define "gpulens.kafkaTlsMount" -}}
- name: kafka-tls
  mountPath: /etc/gpulens/kafka-tls
  readOnly: true
{{- end }}

{{- define "gpulens.kafkaTlsVolume" -}}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.secretName }}
    optional: true
{{- end }}

{{/* A metrics Service (args: root context, name, component, namespace). */}}
{{- define "gpulens.metricsService" -}}
{{- $root := index . 0 }}
{{- $name := index . 1 }}
{{- $component := index . 2 }}
{{- $namespace := index . 3 -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}-metrics
  namespace: {{ $namespace }}
  labels:
    {{- include "gpulens.labels" (dict "name" $name "component" $component) | nindent 4 }}
spec:
  selector:
    app.kubernetes.io/name: {{ $name }}
  ports:
    - name: metrics
      port: {{ $root.Values.metricsPort }}
      targetPort: metrics
      protocol: TCP
{{- end }}

{{/* The component's own ServiceAccount, bound to nothing (args: name, component, namespace). */}}
{{- define "gpulens.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  namespace: {{ .namespace }}
  labels:
    {{- include "gpulens.labels" . | nindent 4 }}
automountServiceAccountToken: false
{{- end }}
