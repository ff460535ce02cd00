#!/usr/bin/env bash
# A kind cluster running mcpfleet: Docker where it answers, else podman (root).
#
#   deploy/kind/up.sh               # create (make kind-up), helm install, print how to reach it
#   deploy/kind/down.sh             # delete the cluster (make kind-down)
#
# The cluster is the one `make kind-up` makes: deploy/kind/cluster.yaml on the
# node image built here from the hack/tools pins (make kind-image), the
# project's images (make image) kind-loaded. Environment: NAMESPACE (default
# mcpfleet), RELEASE (default mcpfleet), HELM (default helm, or .cache/bin/helm
# when built), MONITORING=1 also installs kube-prometheus-stack with
# deploy/kind/monitoring-values.yaml (fetched from its chart repository).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
namespace="${NAMESPACE:-mcpfleet}"
release="${RELEASE:-mcpfleet}"
helm="${HELM:-$(command -v helm || echo "$root/.cache/bin/helm")}"
log() { echo "kind-up: $*" >&2; }

log "creating the cluster (make kind-up)"
export_line="$(make -C "$root" --no-print-directory kind-up | grep '^export KUBECONFIG=')"
eval "$export_line"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -1)"

if [[ "${MONITORING:-0}" == 1 ]]; then
	log "installing kube-prometheus-stack (Prometheus Operator, Prometheus, Grafana)"
	"$helm" repo add prometheus-community https://prometheus-community.github.io/helm-charts >/dev/null
	"$helm" upgrade --install monitoring prometheus-community/kube-prometheus-stack \
		--namespace monitoring --create-namespace -f "$here/monitoring-values.yaml" --wait
fi

log "installing the chart ($release in $namespace)"
"$helm" upgrade --install "$release" "$root/charts/mcpfleet" --namespace "$namespace" --create-namespace \
	--set image.repository=localhost/mcpfleet --set "image.tag=$version" --set image.pullPolicy=Never \
	--set redis.image.repository=localhost/mcpfleet-redis --set "redis.image.tag=$version" \
	--set redis.image.pullPolicy=Never --wait --timeout 10m
"$helm" test "$release" --namespace "$namespace" --logs

cat <<MSG
mcpfleet is up on kind cluster mcpfleet. Reach the router:
  $export_line
  kubectl -n $namespace port-forward svc/$release-router 8000:80 &
  mcpfleet demo --url http://localhost:8000/mcp --era modern
Rotate the keys:
  kubectl -n $namespace create -f $here/keyrotation.yaml
  kubectl -n $namespace get keyrotations -w
MSG
if [[ "${MONITORING:-0}" == 1 ]]; then
	echo "Grafana: kubectl -n monitoring port-forward svc/monitoring-grafana 3000:80  (admin / see monitoring-values.yaml)"
fi
