{{/* Chart name, overridable with nameOverride; 63 characters at most (DNS label). */}}
{{- define "delayq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name prefix: fullnameOverride, else <release>-<chart> (just <release> when it already holds the chart name). */}}
{{- define "delayq.fullname" -}}
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

{{/* chart-version label value. */}}
{{- define "delayq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the node pods; never change them after the first install (StatefulSet selectors are immutable). */}}
{{- define "delayq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "delayq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end -}}

{{/* Labels of every resource: name, instance, version, managed-by, plus commonLabels. */}}
{{- define "delayq.labels" -}}
helm.sh/chart: {{ include "delayq.chart" . }}
app.kubernetes.io/name: {{ include "delayq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: delayq
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* "  annotations:" block (metadata indentation) from commonAnnotations merged with the dict "extra"; nothing when both are empty. Call with (dict "root" $ "extra" .Values.x.annotations). */}}
{{- define "delayq.annotations" -}}
{{- $all := merge (deepCopy (default dict .extra)) (deepCopy .root.Values.commonAnnotations) -}}
{{- with $all }}
  annotations:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- end -}}

{{/* Name of the headless Service that gives each node the DNS name <pod>.<headless>.<namespace>.svc.<clusterDomain>. */}}
{{- define "delayq.headlessName" -}}
{{- printf "%s-headless" (include "delayq.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* ServiceAccount the pods run as. */}}
{{- define "delayq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "delayq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* delayq cluster name (topics, ZooKeeper folder): config.cluster, else the release name. */}}
{{- define "delayq.cluster" -}}
{{- default .Release.Name .Values.config.cluster -}}
{{- end -}}

{{/* Node image reference: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "delayq.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Reconcile image (needs a Java runtime): its own repository/tag/digest, else the node image's with "-spark" appended to the tag. */}}
{{- define "delayq.reconcileImage" -}}
{{- $image := .Values.reconcile.image -}}
{{- $repository := default .Values.image.repository $image.repository -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default (printf "%s-spark" (default .Chart.AppVersion .Values.image.tag)) $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Secret holding the Kafka SASL password and ZooKeeper credentials: auth.existingSecret, else the chart's own. */}}
{{- define "delayq.secretName" -}}
{{- default (include "delayq.fullname" .) .Values.auth.existingSecret -}}
{{- end -}}

{{/* True (non-empty) when Kafka is reached through SASL. */}}
{{- define "delayq.kafkaSasl" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol -}}true{{- end -}}
{{- end -}}

{{/* True (non-empty) when Kafka is reached through TLS. */}}
{{- define "delayq.kafkaTls" -}}
{{- if hasSuffix "SSL" .Values.kafka.securityProtocol -}}true{{- end -}}
{{- end -}}

{{/* True (non-empty) when the chart must render its own Secret (credentials are needed and no existingSecret is named). */}}
{{- define "delayq.createSecret" -}}
{{- if and (not .Values.auth.existingSecret) (or (include "delayq.kafkaSasl" .) .Values.zookeeper.auth.enabled) -}}true{{- end -}}
{{- end -}}

{{/* Fails rendering with a message naming the value and its --set fix when a required value is missing or values contradict each other. */}}
{{- define "delayq.validateValues" -}}
{{- $_ := required "kafka.bootstrapServers is required: the Kafka brokers delayq uses, e.g. --set kafka.bootstrapServers=kafka-0.kafka:9092,kafka-1.kafka:9092" .Values.kafka.bootstrapServers -}}
{{- $_ := required "zookeeper.connect is required: the ZooKeeper ensemble that elects the master, e.g. --set zookeeper.connect=zk-0.zk:2181,zk-1.zk:2181" .Values.zookeeper.connect -}}
{{- if contains "/" .Values.zookeeper.connect -}}
{{- fail (printf "zookeeper.connect %q must not carry a chroot: delayq keeps its data under /delayq/<cluster>; pick the folder with --set config.cluster=NAME instead" .Values.zookeeper.connect) -}}
{{- end -}}
{{- if contains "/" (include "delayq.cluster" .) -}}
{{- fail (printf "config.cluster %q must be a name without '/', e.g. --set config.cluster=orders" (include "delayq.cluster" .)) -}}
{{- end -}}
{{- if include "delayq.kafkaSasl" . -}}
{{- $_ := required (printf "kafka.sasl.username is required with kafka.securityProtocol=%s: --set kafka.sasl.username=USER" .Values.kafka.securityProtocol) .Values.kafka.sasl.username -}}
{{- if not .Values.auth.existingSecret -}}
{{- $_ := required (printf "kafka.sasl.password is required with kafka.securityProtocol=%s: --set kafka.sasl.password=PASSWORD, or name a Secret holding it with --set auth.existingSecret=NAME" .Values.kafka.securityProtocol) .Values.kafka.sasl.password -}}
{{- end -}}
{{- end -}}
{{- if and .Values.zookeeper.auth.enabled (not .Values.auth.existingSecret) -}}
{{- $_ := required "zookeeper.auth.credentials is required with zookeeper.auth.enabled=true: --set zookeeper.auth.credentials=USER:PASSWORD, or name a Secret holding them with --set auth.existingSecret=NAME" .Values.zookeeper.auth.credentials -}}
{{- end -}}
{{- if and .Values.kafka.tls.existingSecret (not (include "delayq.kafkaTls" .)) -}}
{{- fail (printf "kafka.tls.existingSecret is set but kafka.securityProtocol=%s does not use TLS: --set kafka.securityProtocol=SSL (or SASL_SSL)" .Values.kafka.securityProtocol) -}}
{{- end -}}
{{- if ne (empty .Values.kafka.tls.certKey) (empty .Values.kafka.tls.keyKey) -}}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey go together (mutual TLS needs both): --set kafka.tls.certKey=tls.crt --set kafka.tls.keyKey=tls.key" -}}
{{- end -}}
{{- if and .Values.kafka.tls.certKey (not .Values.kafka.tls.existingSecret) -}}
{{- fail "kafka.tls.certKey needs the Secret that holds it: --set kafka.tls.existingSecret=NAME" -}}
{{- end -}}
{{- $shards := int64 .Values.config.shards -}}
{{- $partitions := int64 .Values.config.bufferPartitions -}}
{{- if and (gt $shards 0) (gt $partitions 0) (ne (mod $partitions $shards) 0) -}}
{{- $divisors := list -}}
{{- range $i := until (int $partitions) -}}
{{- if eq (mod $partitions (add1 $i)) 0 -}}{{- $divisors = append $divisors (add1 $i) -}}{{- end -}}
{{- end -}}
{{- fail (printf "config.bufferPartitions=%d must be a multiple of config.shards=%d, so that every shard gets as many buffer partitions: --set config.shards=N with N one of %s, or (for a buffer topic not yet created) e.g. --set config.bufferPartitions=%d. config.shards is fixed by the first `delayq init` and cannot change afterwards" $partitions $shards (join ", " $divisors) (mul $shards (add1 (div $partitions $shards)))) -}}
{{- end -}}
{{- $reports := .Values.reconcile.reports -}}
{{- if and $reports.url $reports.existingClaim -}}
{{- fail (printf "reconcile.reports.url=%s and reconcile.reports.existingClaim=%s both say where the reports go: keep one, e.g. --set reconcile.reports.existingClaim=" $reports.url $reports.existingClaim) -}}
{{- end -}}
{{- if and (or $reports.credentialsSecret $reports.endpoint) (not $reports.url) -}}
{{- fail "reconcile.reports.credentialsSecret and reconcile.reports.endpoint are for an object store: name it with --set reconcile.reports.url=s3://BUCKET/PREFIX" -}}
{{- end -}}
{{- $console := .Values.console -}}
{{- if and $console.actions.enabled (not $console.auth.existingSecret) -}}
{{- fail "console.actions.enabled=true lets whoever reaches the console cancel, reschedule and replay: it needs a login, --set console.auth.existingSecret=NAME (a Secret with the keys user, password and secret-key; see values.yaml)" -}}
{{- end -}}
{{- if ne (empty $console.auth.userKey) (empty $console.auth.passwordKey) -}}
{{- fail "console.auth.userKey and console.auth.passwordKey go together (a login is both): set both, or both to \"\" and use --set console.auth.tokenKey=token" -}}
{{- end -}}
{{- if and $console.actions.enabled (empty $console.auth.userKey) (empty $console.auth.tokenKey) -}}
{{- fail "console.actions.enabled=true needs a way to log in: --set console.auth.userKey=user,console.auth.passwordKey=password or --set console.auth.tokenKey=token (keys of console.auth.existingSecret)" -}}
{{- end -}}
{{- $consoleSasl := $console.deployment.kafka.sasl -}}
{{- if and $consoleSasl.username (not (include "delayq.kafkaSasl" .)) -}}
{{- fail (printf "console.deployment.kafka.sasl.username is set but kafka.securityProtocol=%s does not use SASL: --set kafka.securityProtocol=SASL_SSL (or SASL_PLAINTEXT), or --set console.deployment.kafka.sasl.username=" .Values.kafka.securityProtocol) -}}
{{- end -}}
{{- if and (include "delayq.consoleOwnPrincipal" .) (not .Values.auth.existingSecret) (not $consoleSasl.password) -}}
{{- fail (printf "console.deployment.kafka.sasl.password is required with console.deployment.kafka.sasl.username=%s: --set console.deployment.kafka.sasl.password=PASSWORD, or put it under the key %s of --set auth.existingSecret=NAME" $consoleSasl.username .Values.auth.consoleKafkaSaslPasswordKey) -}}
{{- end -}}
{{- $ingress := $console.deployment.ingress -}}
{{- if and $ingress.enabled $ingress.tlsSecret (not $ingress.host) -}}
{{- fail "console.deployment.ingress.tlsSecret needs the host its certificate is for: --set console.deployment.ingress.host=delayq.example.com" -}}
{{- end -}}
{{- $replicas := int64 .Values.config.replicas -}}
{{- if and (gt $replicas 0) (gt $replicas (int64 .Values.replicaCount)) -}}
{{- fail (printf "config.replicas=%d is more than replicaCount=%d: a shard cannot be held by more nodes than there are; --set config.replicas=%d (or 0: every node holds every shard), or --set replicaCount=%d" $replicas (int64 .Values.replicaCount) (int64 .Values.replicaCount) $replicas) -}}
{{- end -}}
{{- end -}}

{{/* The DELAYQ_* settings the chart's own values set, as a YAML map. */}}
{{- define "delayq.chartSettingsEnv" -}}
DELAYQ_BOOTSTRAP_SERVERS: {{ .Values.kafka.bootstrapServers | quote }}
DELAYQ_ZK_CONNECT: {{ .Values.zookeeper.connect | quote }}
DELAYQ_ZK_SESSION_TIMEOUT_MS: {{ .Values.zookeeper.sessionTimeoutMs | int64 | quote }}
DELAYQ_CLUSTER: {{ include "delayq.cluster" . | quote }}
{{- with .Values.config.bufferTopic }}
DELAYQ_BUFFER_TOPIC: {{ . | quote }}
{{- end }}
{{- with .Values.config.deadLetterTopic }}
DELAYQ_DEAD_LETTER_TOPIC: {{ . | quote }}
{{- end }}
DELAYQ_BUFFER_PARTITIONS: {{ .Values.config.bufferPartitions | int64 | quote }}
DELAYQ_SHARDS: {{ .Values.config.shards | int64 | quote }}
DELAYQ_REPLICAS: {{ .Values.config.replicas | int64 | quote }}
DELAYQ_PROCESSES: {{ .Values.config.processes | int64 | quote }}
{{- if gt (int64 .Values.config.bufferReplicationFactor) 0 }}
DELAYQ_BUFFER_REPLICATION_FACTOR: {{ .Values.config.bufferReplicationFactor | int64 | quote }}
{{- end }}
{{- if gt (int64 .Values.config.bufferMinInsyncReplicas) 0 }}
DELAYQ_BUFFER_MIN_INSYNC_REPLICAS: {{ .Values.config.bufferMinInsyncReplicas | int64 | quote }}
{{- end }}
DELAYQ_MIN_COMPACTION_LAG_MS: {{ .Values.config.minCompactionLagMs | int64 | quote }}
DELAYQ_DELETE_RETENTION_MS: {{ .Values.config.deleteRetentionMs | int64 | quote }}
DELAYQ_DELIVERY_BATCH_SIZE: {{ .Values.config.deliveryBatchSize | int64 | quote }}
DELAYQ_DELIVERY_MAX_ATTEMPTS: {{ .Values.config.deliveryMaxAttempts | int64 | quote }}
DELAYQ_DELIVERY_RETRY_BACKOFF_MS: {{ .Values.config.deliveryRetryBackoffMs | int64 | quote }}
{{- with .Values.config.dispatchLimits }}
DELAYQ_DISPATCH_LIMITS: {{ toJson . | quote }}
{{- end }}
{{- with .Values.config.targetTopics }}
DELAYQ_TARGET_TOPICS: {{ join "," . | quote }}
{{- end }}
{{- if .Values.console.enabled }}
DELAYQ_CONSOLE: "true"
{{- end }}
{{- if .Values.console.actions.enabled }}
DELAYQ_CONSOLE_ACTIONS: "true"
{{- end }}
DELAYQ_DATA_DIR: {{ .Values.persistence.mountPath | quote }}
DELAYQ_HTTP_HOST: "0.0.0.0"
DELAYQ_HTTP_PORT: {{ .Values.containerPorts.http | int64 | quote }}
DELAYQ_KAFKA__SECURITY_PROTOCOL: {{ .Values.kafka.securityProtocol | quote }}
{{- if include "delayq.kafkaSasl" . }}
DELAYQ_KAFKA__SASL_MECHANISM: {{ .Values.kafka.sasl.mechanism | quote }}
DELAYQ_KAFKA__SASL_USERNAME: {{ .Values.kafka.sasl.username | quote }}
{{- end }}
{{- if .Values.kafka.tls.existingSecret }}
DELAYQ_KAFKA__SSL_CA_LOCATION: {{ printf "/etc/delayq/kafka-tls/%s" .Values.kafka.tls.caKey | quote }}
{{- if .Values.kafka.tls.certKey }}
DELAYQ_KAFKA__SSL_CERTIFICATE_LOCATION: {{ printf "/etc/delayq/kafka-tls/%s" .Values.kafka.tls.certKey | quote }}
DELAYQ_KAFKA__SSL_KEY_LOCATION: {{ printf "/etc/delayq/kafka-tls/%s" .Values.kafka.tls.keyKey | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A value as environment text: whole numbers without exponent (values files give float64), lists and maps as JSON. */}}
{{- define "delayq.envValue" -}}
{{- if or (kindIs "slice" .) (kindIs "map" .) -}}
{{- toJson . -}}
{{- else if and (kindIs "float64" .) (eq . (floor .)) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* The DELAYQ_* settings every delayq process of the release shares (ConfigMap data): the chart's, then kafka.extraConfig and config.extraSettings, refusing what the chart sets itself. */}}
{{- define "delayq.settingsEnv" -}}
{{- $chart := include "delayq.chartSettingsEnv" . -}}
{{- $managed := fromYaml $chart -}}
{{- $chart }}
{{- range $key, $value := .Values.kafka.extraConfig }}
{{- $name := printf "DELAYQ_KAFKA__%s" ($key | upper | replace "." "_") }}
{{- if not (regexMatch "^[a-z0-9]+(\\.[a-z0-9]+)*$" $key) }}
{{- fail (printf "kafka.extraConfig key %q: use librdkafka's dotted lower-case name, e.g. --set kafka.extraConfig.client\\.rack=eu-west-1a" $key) }}
{{- else if or (hasKey $managed $name) (has $key (list "bootstrap.servers" "security.protocol" "sasl.mechanism" "sasl.mechanisms" "sasl.username" "sasl.password" "ssl.key.password")) }}
{{- fail (printf "kafka.extraConfig.%s is set through the chart's own values (kafka.bootstrapServers, kafka.securityProtocol, kafka.sasl.*, kafka.tls.*; passwords only from the Secret)" $key) }}
{{- end }}
{{ $name }}: {{ include "delayq.envValue" $value | quote }}
{{- end }}
{{- range $key, $value := .Values.config.extraSettings }}
{{- $name := printf "DELAYQ_%s" (upper $key) }}
{{- if not (regexMatch "^[a-z][a-z0-9_]*$" $key) }}
{{- fail (printf "config.extraSettings key %q: use the settings field name in snake_case, e.g. --set config.extraSettings.max_delay_ms=86400000" $key) }}
{{- else if eq $key "kafka" }}
{{- fail "config.extraSettings.kafka: librdkafka settings go in kafka.extraConfig, e.g. --set kafka.extraConfig.client\\.rack=eu-west-1a" }}
{{- else if or (hasKey $managed $name) (eq $key "node_id") (eq $key "node_group") }}
{{- fail (printf "config.extraSettings.%s is set by the chart itself: use its own value (see values.yaml) instead" $key) }}
{{- else if eq $key "target_topics" }}
{{- /* Refused even when config.targetTopics is empty: a list here would reach the node as JSON, which DELAYQ_TARGET_TOPICS (comma-separated) does not read. */}}
{{- fail "config.extraSettings.target_topics: use the chart's list, e.g. --set 'config.targetTopics={orders*,payments}'" }}
{{- end }}
{{ $name }}: {{ include "delayq.envValue" $value | quote }}
{{- end }}
{{- end -}}

{{/* Credentials of a delayq container, from the Secret named "secretName": the SASL password under "passwordKey" (default auth.kafkaSaslPasswordKey), ZooKeeper's unless "zookeeper" is false. Call with (dict "root" $ "secretName" NAME). */}}
{{- define "delayq.secretEnv" -}}
{{- $root := .root -}}
{{- if include "delayq.kafkaSasl" $root }}
- name: DELAYQ_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ default $root.Values.auth.kafkaSaslPasswordKey .passwordKey }}
{{- end }}
{{- if and $root.Values.zookeeper.auth.enabled (ternary .zookeeper true (hasKey . "zookeeper")) }}
- name: DELAYQ_ZK_AUTH
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ $root.Values.auth.zookeeperCredentialsKey }}
{{- end }}
{{- end -}}

{{/* The ConfigMap of DELAYQ_* settings; "name" and "hook" (the pre-install copy) vary. Call with (dict "root" $ "name" NAME "hook" BOOL). */}}
{{- define "delayq.configMap" -}}
{{- $root := .root -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "delayq.labels" $root | nindent 4 }}
  {{- include "delayq.metaAnnotations" . }}
data:
  {{- include "delayq.settingsEnv" $root | nindent 2 }}
{{- end -}}

{{/* metadata.annotations of a resource that has a pre-install hook copy: the hook annotations when "hook" is true. Call with (dict "root" $ "hook" BOOL). */}}
{{- define "delayq.metaAnnotations" -}}
{{- if .hook -}}
{{- include "delayq.annotations" (dict "root" .root "extra" (include "delayq.initHookAnnotations" (dict "weight" "-10") | fromYaml)) -}}
{{- else -}}
{{- include "delayq.annotations" (dict "root" .root) -}}
{{- end -}}
{{- end -}}

{{/* Pod template annotations that restart pods when the release's settings or chart-made credentials change. */}}
{{- define "delayq.checksumAnnotations" -}}
checksum/config: {{ include "delayq.configMap" (dict "root" . "name" (include "delayq.fullname" .) "hook" false) | sha256sum }}
{{- if include "delayq.createSecret" . }}
checksum/secret: {{ include "delayq.secret" (dict "root" . "name" (include "delayq.fullname" .) "hook" false) | sha256sum }}
{{- end }}
{{- end -}}

{{/* Fields of a container running `delayq reconcile` after its name and arguments: the Spark image, /tmp as home, the release's settings and credentials, more "env" (a list of EnvVar), "resources", the security context. Call with (dict "root" $ "env" LIST "resources" MAP). */}}
{{- define "delayq.reconcileContainer" -}}
{{- $root := .root -}}
image: {{ include "delayq.reconcileImage" $root }}
imagePullPolicy: {{ $root.Values.reconcile.image.pullPolicy }}
# Spark writes its scratch files and warehouse under HOME and the working folder: both on /tmp.
workingDir: /tmp
envFrom:
  - configMapRef:
      name: {{ include "delayq.fullname" $root }}
env:
  - name: HOME
    value: /tmp
  {{- with include "delayq.secretEnv" (dict "root" $root "secretName" (include "delayq.secretName" $root)) }}
  {{- . | trim | nindent 2 }}
  {{- end }}
  {{- with .env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.containerSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Environment of the batch report's container saying where reports go (REPORTS: /reports, or reconcile.reports.url), with the object store's credentials and endpoint, as a YAML list. */}}
{{- define "delayq.reportsEnv" -}}
{{- $reports := .Values.reconcile.reports -}}
- name: REPORTS
  value: {{ default "/reports" ($reports.url | trimSuffix "/") | quote }}
{{- with $reports.credentialsSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: AWS_SECRET_ACCESS_KEY
{{- end }}
{{- with $reports.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Name of the continuous reconciliation's Deployment and Service. */}}
{{- define "delayq.reconcileFollowName" -}}
{{- printf "%s-reconcile-follow" (include "delayq.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the continuous reconciliation's pod. */}}
{{- define "delayq.reconcileFollowSelectorLabels" -}}
app.kubernetes.io/name: {{ include "delayq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: reconcile-follow
{{- end -}}

{{/* Claim holding the continuous reconciliation's checkpoint: reconcile.follow.checkpoint.existingClaim, else the chart's own. */}}
{{- define "delayq.reconcileCheckpointClaim" -}}
{{- default (printf "%s-reconcile-checkpoint" (include "delayq.fullname" .) | trunc 63 | trimSuffix "-") .Values.reconcile.follow.checkpoint.existingClaim -}}
{{- end -}}

{{/* Topic the continuous reconciliation reports findings to: reconcile.follow.findingsTopic, else delayq-<cluster>-reconcile-findings (the command's own default). */}}
{{- define "delayq.findingsTopic" -}}
{{- default (printf "delayq-%s-reconcile-findings" (include "delayq.cluster" .)) .Values.reconcile.follow.findingsTopic -}}
{{- end -}}

{{/* Name of the console's Deployment, Service, Ingress and index claim. */}}
{{- define "delayq.consoleName" -}}
{{- printf "%s-console" (include "delayq.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the console's pod. */}}
{{- define "delayq.consoleSelectorLabels" -}}
app.kubernetes.io/name: {{ include "delayq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: console
{{- end -}}

{{/* Claim holding the console Deployment's index: console.deployment.persistence.existingClaim, else the chart's own. */}}
{{- define "delayq.consoleIndexClaim" -}}
{{- default (include "delayq.consoleName" .) .Values.console.deployment.persistence.existingClaim -}}
{{- end -}}

{{/* True (non-empty) when the console Deployment talks to Kafka as a SASL principal of its own. */}}
{{- define "delayq.consoleOwnPrincipal" -}}
{{- if and .Values.console.deployment.enabled .Values.console.deployment.kafka.sasl.username (include "delayq.kafkaSasl" .) -}}true{{- end -}}
{{- end -}}

{{/* The console's login and session key (DELAYQ_CONSOLE_USER, _PASSWORD, _TOKEN, _SECRET_KEY) from console.auth.existingSecret, each key left out when its value is empty; nothing without the Secret. */}}
{{- define "delayq.consoleAuthEnv" -}}
{{- $auth := .Values.console.auth -}}
{{- if $auth.existingSecret }}
{{- range list (list "USER" $auth.userKey) (list "PASSWORD" $auth.passwordKey) (list "TOKEN" $auth.tokenKey) (list "SECRET_KEY" $auth.secretKeyKey) }}
{{- if index . 1 }}
- name: DELAYQ_CONSOLE_{{ index . 0 }}
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret }}
      key: {{ index . 1 }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Volume mounts every delayq container needs: a writable /tmp (the root filesystem is read-only), the Kafka TLS files. */}}
{{- define "delayq.commonVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  mountPath: /etc/delayq/kafka-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* Volumes behind delayq.commonVolumeMounts. */}}
{{- define "delayq.commonVolumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* Pod-level fields shared by every delayq pod: pull secrets, service account, security context, scheduling. */}}
{{- define "delayq.podCommon" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The Secret with the Kafka SASL password and ZooKeeper credentials; "name" and "hook" (the pre-install copy) vary. Call with (dict "root" $ "name" NAME "hook" BOOL). */}}
{{- define "delayq.secret" -}}
{{- $root := .root -}}
apiVersion: v1
kind: Secret
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "delayq.labels" $root | nindent 4 }}
  {{- include "delayq.metaAnnotations" . }}
type: Opaque
stringData:
  {{- if include "delayq.kafkaSasl" $root }}
  {{ $root.Values.auth.kafkaSaslPasswordKey }}: {{ $root.Values.kafka.sasl.password | quote }}
  {{- end }}
  {{- if $root.Values.zookeeper.auth.enabled }}
  {{ $root.Values.auth.zookeeperCredentialsKey }}: {{ $root.Values.zookeeper.auth.credentials | quote }}
  {{- end }}
  {{- if include "delayq.consoleOwnPrincipal" $root }}
  {{ $root.Values.auth.consoleKafkaSaslPasswordKey }}: {{ $root.Values.console.deployment.kafka.sasl.password | quote }}
  {{- end }}
{{- end -}}

{{/* Helm hook annotations of the `delayq init` Job and its pre-install copies, ordered by "weight". */}}
{{- define "delayq.initHookAnnotations" -}}
helm.sh/hook: pre-install,pre-upgrade
helm.sh/hook-weight: {{ .weight | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}

{{/* HTTP GET probe on a named container port ("port", default http); "path" is e.g. /livez, /readyz or /metrics, "probe" the values block. Call with (dict "path" P "probe" .Values.xProbe "port" "http"). */}}
{{- define "delayq.httpProbe" -}}
httpGet:
  path: {{ .path }}
  port: {{ default "http" .port }}
{{- range $key, $value := omit .probe "enabled" }}
{{ $key }}: {{ $value }}
{{- end }}
{{- end -}}

{{/* Pod affinity: .Values.affinity when set, else the anti-affinity preset (soft: preferred, hard: required, none) spreading nodes over hosts. */}}
{{- define "delayq.affinity" -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity -}}
{{- else if eq .Values.podAntiAffinityPreset "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "delayq.selectorLabels" . | nindent 12 }}
{{- else if eq .Values.podAntiAffinityPreset "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "delayq.selectorLabels" . | nindent 10 }}
{{- end -}}
{{- end -}}
