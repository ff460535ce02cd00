#!/usr/bin/env bash
# A kind cluster running mcpfleet: Docker where it answers, else podman (root).
#
#   deploy/kind/up.sh               # create (make kind-up), helm install, print how to reach it
#   deploy/kind/down.sh             # delete the cluster (make kind-down)
#
# The cluster is the one `make kind-up` makes: deploy/kind/cluster.yaml on the
# node image built here from the hack/tools pins (make kind-image), the
# project's images (make image) kind-loaded. Environment: KIND_CLUSTER (default
# mcpfleet; an existing cluster of that name is used as it is), NAMESPACE
# (default mcpfleet), RELEASE (default mcpfleet), HELM (default helm, or
# .cache/bin/helm when built), MONITORING=1 also installs kube-prometheus-stack
# with deploy/kind/monitoring-values.yaml (fetched from its chart repository),
# AUTOSCALING=1 also installs KEDA (built here from its pin) and, without
# MONITORING=1, a Prometheus scraping the replicas, and scales the replicas on
# their MCP signals (server.autoscaling.mcp, docs/autoscaling.md).
#
# The `export KUBECONFIG=...` line is printed as soon as the cluster exists,
# before any step that can fail, so a failed install still leaves you the way
# in (and deploy/kind/down.sh the way out).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cluster="${KIND_CLUSTER:-mcpfleet}"
namespace="${NAMESPACE:-mcpfleet}"
release="${RELEASE:-mcpfleet}"
helm="${HELM:-$(command -v helm || echo "$root/.cache/bin/helm")}"
log() { echo "kind-up: $*" >&2; }

log "creating the cluster $cluster (make kind-up)"
export_line="$(make -C "$root" --no-print-directory kind-up "KIND_CLUSTER=$cluster" | grep '^export KUBECONFIG=')"
echo "$export_line"
eval "$export_line"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -1)"

if [[ "${MONITORING:-0}" == 1 ]]; then
	log "installing kube-prometheus-stack (Prometheus Operator, Prometheus, Grafana)"
	"$helm" repo add prometheus-community https://prometheus-community.github.io/helm-charts >/dev/null
	"$helm" upgrade --install monitoring prometheus-community/kube-prometheus-stack \
		--namespace monitoring --create-namespace -f "$here/monitoring-values.yaml" --wait
fi

autoscaling=()
if [[ "${AUTOSCALING:-0}" == 1 ]]; then
	log "installing KEDA and the Prometheus its triggers read (make autoscaling-images)"
	make -C "$root" --no-print-directory autoscaling-images >/dev/null
	prometheus=()
	[[ "${MONITORING:-0}" == 1 ]] && prometheus=(--no-prometheus)
	PYTHONPATH="$root/hack/devkit" "$root/.venv/bin/python" -m fleetkit.cluster.autoscaler install \
		--name "$cluster" --namespace "$namespace" --release "$release" "${prometheus[@]}"
	# kind runs no metrics-server: the CPU trigger off (an HPA with a metric it cannot
	# read never scales down).
	autoscaling=(--set server.autoscaling.enabled=true --set server.autoscaling.mcp.enabled=true
		--set server.autoscaling.mcp.cpu=false)
fi

log "installing the chart ($release in $namespace)"
"$helm" upgrade --install "$release" "$root/charts/mcpfleet" --namespace "$namespace" --create-namespace "${autoscaling[@]}" \
	--set image.repository=localhost/mcpfleet --set "image.tag=$version" --set image.pullPolicy=Never \
	--set redis.image.repository=localhost/mcpfleet-redis --set "redis.image.tag=$version" \
	--set redis.image.pullPolicy=Never --wait --timeout 10m
# The chart's test Pod is deleted when it succeeds (hook-delete-policy
# hook-succeeded), so its logs are read only when it failed and is still there.
log "helm test $release"
kubectl="$(command -v kubectl || echo "$root/.cache/bin/kubectl")"
if ! "$helm" test "$release" --namespace "$namespace" --timeout 5m; then
	for pod in $("$kubectl" --namespace "$namespace" get pods -o name | grep -- '-selftest$' || true); do
		"$kubectl" --namespace "$namespace" logs "$pod" >&2 || true
	done
	log "helm test failed; the cluster stays up (deploy/kind/down.sh deletes it)"
	exit 1
fi

# The router's Service, by its labels (its name depends on the release's).
router="$("$kubectl" --namespace "$namespace" get services -o name \
	-l "app.kubernetes.io/instance=$release,app.kubernetes.io/component=router")"
cat <<MSG
mcpfleet is up on kind cluster $cluster. Reach the router:
  $export_line
  kubectl -n $namespace port-forward $router 8000:80 &
  mcpfleet demo --url http://localhost:8000/mcp --era modern
Rotate the keys:
  kubectl -n $namespace create -f $here/keyrotation.yaml
  kubectl -n $namespace get keyrotations -w
MSG
if [[ "${AUTOSCALING:-0}" == 1 ]]; then
	echo "Watch it scale: kubectl -n $namespace get hpa,scaledobject -w  (docs/autoscaling.md)"
fi
if [[ "${MONITORING:-0}" == 1 ]]; then
	echo "Grafana: kubectl -n monitoring port-forward svc/monitoring-grafana 3000:80  (admin / see monitoring-values.yaml)"
fi
