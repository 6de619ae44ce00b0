{{/* Chart name, shortened to the 63 characters a label value allows. */}}
{{- define "ungater.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects: the release name when it already contains the chart's. */}}
{{- define "ungater.fullname" -}}
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

{{- define "ungater.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the controller's pods; never change them on upgrade. */}}
{{- define "ungater.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ungater.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ungater.labels" -}}
{{ include "ungater.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: ungater
app.kubernetes.io/managed-by: {{ .Values.managedBy | default .Release.Service }}
helm.sh/chart: {{ include "ungater.chart" . }}
{{- end -}}

{{- define "ungater.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ungater.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The namespace of the leader-election Lease: config.leaderElection.namespace, else kube-system,
the controller's own default (ungater/_config.py), so that an `ungater run` from a laptop and
this Deployment meet on one Lease.
*/}}
{{- define "ungater.leaseNamespace" -}}
{{- $le := .Values.config.leaderElection | default dict -}}
{{- $le.namespace | default "kube-system" -}}
{{- end -}}

{{/*
The Lease name the controller derives from the gates it releases (config.default_lease_name):
"ungater-<gates, readable>-<8 hex of sha256 of the sorted gates joined by commas>". A unit test
renders this and compares it with the Python function.
*/}}
{{- define "ungater.defaultLeaseName" -}}
{{- $gate := .Values.config.gate | default "kueue.x-k8s.io/elastic-job" -}}
{{- $gates := list -}}
{{- range (.Values.config.kinds | default (list (dict))) -}}
{{- $gates = append $gates (.gate | default $gate) -}}
{{- end -}}
{{- $joined := $gates | uniq | sortAlpha | join "," -}}
{{- $digest := sha256sum $joined | trunc 8 -}}
{{- $readable := regexReplaceAll "[^a-z0-9]+" (lower $joined) "-" | trimAll "-" | trunc 30 | trimSuffix "-" -}}
{{- if $readable -}}
{{- printf "ungater-%s-%s" $readable $digest -}}
{{- else -}}
{{- printf "ungater-%s" $digest -}}
{{- end -}}
{{- end -}}

{{/*
A shard's Lease (config.shard_lease_name), for leaderElection.shardByNamespace:
"<defaultLeaseName>-<namespaces, readable>-<8 hex of sha256 of "<gates>|<namespaces>">", both
lists sorted and joined by commas. A test renders this and compares it with the Python function.
*/}}
{{- define "ungater.shardLeaseName" -}}
{{- $gate := .Values.config.gate | default "kueue.x-k8s.io/elastic-job" -}}
{{- $gates := list -}}
{{- range (.Values.config.kinds | default (list (dict))) -}}
{{- $gates = append $gates (.gate | default $gate) -}}
{{- end -}}
{{- $joined := $gates | uniq | sortAlpha | join "," -}}
{{- $namespaces := .Values.config.namespaces | default list -}}
{{- if not $namespaces -}}
{{- fail "config.leaderElection.shardByNamespace needs config.namespaces: a shard of all namespaces would overlap every other shard" -}}
{{- end -}}
{{- $nsJoined := $namespaces | uniq | sortAlpha | join "," -}}
{{- $digest := sha256sum (printf "%s|%s" $joined $nsJoined) | trunc 8 -}}
{{- $readable := regexReplaceAll "[^a-z0-9]+" $nsJoined "-" | trimAll "-" | trunc 30 | trimSuffix "-" -}}
{{- printf "%s-%s-%s" (include "ungater.defaultLeaseName" .) $readable $digest -}}
{{- end -}}

{{/*
The name of the leader-election Lease: the shard's when leaderElection.shardByNamespace, else
config.leaderElection.leaseName, else the derived one.
*/}}
{{- define "ungater.leaseName" -}}
{{- $le := .Values.config.leaderElection | default dict -}}
{{- if $le.shardByNamespace -}}
{{- if $le.leaseName -}}
{{- fail "config.leaderElection.shardByNamespace derives the Lease name: leave leaseName empty" -}}
{{- end -}}
{{- include "ungater.shardLeaseName" . -}}
{{- else -}}
{{- $le.leaseName | default (include "ungater.defaultLeaseName" .) -}}
{{- end -}}
{{- end -}}

{{/* The port of config.server.address (":8080", "0.0.0.0:8080"): container port, probes, Service. */}}
{{- define "ungater.port" -}}
{{- $server := .Values.config.server | default dict -}}
{{- $address := $server.address | default ":8080" | toString -}}
{{- $port := regexFind "[0-9]+$" $address -}}
{{- if not $port -}}
{{- fail (printf "config.server.address %q has no port" $address) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{/* "cluster" or "namespaced": how the ClusterRole is bound (see rbac.scope in values.yaml). */}}
{{- define "ungater.rbacScope" -}}
{{- $scope := .Values.rbac.scope | default "auto" -}}
{{- if eq $scope "auto" -}}
{{- if .Values.config.namespaces -}}namespaced{{- else -}}cluster{{- end -}}
{{- else if eq $scope "cluster" -}}
cluster
{{- else if eq $scope "namespaced" -}}
{{- if not .Values.config.namespaces -}}
{{- fail "rbac.scope=namespaced needs config.namespaces: with no namespaces the controller watches all of them" -}}
{{- end -}}
namespaced
{{- else -}}
{{- fail (printf "rbac.scope must be auto, cluster or namespaced, not %q" $scope) -}}
{{- end -}}
{{- end -}}

{{/*
The config file: .Values.config as given, with the Lease namespace and name filled in. Refuses a
deployment that would run two releasers at once (replicas > 1 without leader election).
*/}}
{{- define "ungater._config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $le := get $config "leaderElection" | default dict -}}
{{- if and (gt (int .Values.replicaCount) 1) (not $le.enabled) -}}
{{- fail "replicaCount > 1 needs config.leaderElection.enabled: two active replicas would both release the same gate and break the cap" -}}
{{- end -}}
{{- if $le.enabled -}}
{{- $duration := $le.leaseDurationSeconds | default 15 | float64 -}}
{{- $renew := $le.renewDeadlineSeconds | default 10 | float64 -}}
{{- $retry := $le.retryPeriodSeconds | default 2 | float64 -}}
{{- if ge $renew $duration -}}
{{- fail (printf "config.leaderElection.renewDeadlineSeconds (%v) must be less than leaseDurationSeconds (%v): a leader must stop before its Lease can expire" $renew $duration) -}}
{{- end -}}
{{- if le $renew (mulf 1.2 $retry) -}}
{{- fail (printf "config.leaderElection.renewDeadlineSeconds (%v) must exceed 1.2 x retryPeriodSeconds (%v), or one slow retry loses the Lease" $renew $retry) -}}
{{- end -}}
{{- end -}}
{{- $server := get $config "server" | default dict -}}
{{- $host := regexReplaceAll ":[0-9]*$" ($server.address | default ":8080" | toString) "" | trimAll "[]" | lower -}}
{{- if or (eq $host "localhost") (eq $host "::1") (hasPrefix "127." $host) -}}
{{- fail (printf "config.server.address %q is a loopback address: the kubelet's probes and Prometheus cannot reach it in a pod; use \":8080\"" $server.address) -}}
{{- end -}}
{{- if hasKey $config "leaderElection" -}}
{{- $_ := set $le "namespace" (include "ungater.leaseNamespace" .) -}}
{{- if $le.shardByNamespace -}}
{{- $_ := unset $le "leaseName" -}}
{{- else -}}
{{- $_ := set $le "leaseName" (include "ungater.leaseName" .) -}}
{{- end -}}
{{- $_ := set $config "leaderElection" $le -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/*
"true" when some configured kind may release (mode release or auto, per kind or global), so
the controller needs pods/patch; empty when every kind only audits.
*/}}
{{- define "ungater.patchesPods" -}}
{{- $global := .Values.config.mode | default "auto" -}}
{{- $patch := false -}}
{{- range (.Values.config.kinds | default (list (dict "mode" $global))) -}}
{{- if ne (.mode | default $global) "audit" -}}{{- $patch = true -}}{{- end -}}
{{- end -}}
{{- if $patch -}}true{{- end -}}
{{- end -}}
