#!/usr/bin/env bash
# A kind cluster running mcpfleet, on any machine with Docker and kind:
#
#   deploy/kind/up.sh               # create, build + load the images, helm install, print how to reach it
#   deploy/kind/down.sh             # delete the cluster
#
# Environment: CLUSTER (default mcpfleet), NAMESPACE (default mcpfleet),
# RELEASE (default mcpfleet), HELM (default helm, or .cache/bin/helm when built),
# MONITORING=1 also installs kube-prometheus-stack with deploy/kind/monitoring-values.yaml.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cluster="${CLUSTER:-mcpfleet}"
namespace="${NAMESPACE:-mcpfleet}"
release="${RELEASE:-mcpfleet}"
helm="${HELM:-$(command -v helm || echo "$root/.cache/bin/helm")}"
log() { echo "kind-up: $*" >&2; }

for tool in docker kind kubectl; do
	command -v "$tool" >/dev/null || { log "needs $tool"; exit 1; }
done

if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
	log "creating cluster $cluster"
	kind create cluster --name "$cluster" --config "$here/cluster.yaml" --wait 120s
fi

log "building the images (make image)"
IMAGE_BUILDER=docker bash "$root/hack/image/build.sh" >/dev/null
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -1)"
for image in mcpfleet mcpfleet-redis; do
	kind load image-archive "$root/.cache/image/$image-$version.tar" --name "$cluster"
done

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
mcpfleet is up on kind cluster $cluster. Reach the router:
  kubectl -n $namespace port-forward svc/$release-router 8000:80 &
  mcpfleet demo --url http://localhost:8000/mcp --era modern
Rotate the keys:
  kubectl -n $namespace create -f $here/keyrotation.yaml
  kubectl -n $namespace get keyrotations -w
MSG
if [[ "${MONITORING:-0}" == 1 ]]; then
	echo "Grafana: kubectl -n monitoring port-forward svc/monitoring-grafana 3000:80  (admin / see monitoring-values.yaml)"
fi
