#!/usr/bin/env bash
# Build the pinned Kubernetes tools of the control-plane test tier.
#
#   bash hack/tools/build.sh OUTDIR        (the Makefile passes .cache/bin)
#   bash hack/tools/build.sh OUTDIR helm   (only the named tools)
#
# Versions come from hack/tools/go.mod (with go.sum, the only pin): this script
# builds straight from the Go module proxy, no vendor tree. A binary is rebuilt
# only when its stamp (go.mod, go.sum, Go version, package, ldflags) changes;
# the Go build cache makes a rebuild after a pin change cost only what changed.
#
# Environment: TOOLS_GO_P (parallel compile jobs, default 2 for the 2-core
# machines this project runs on).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
outdir="${1:?usage: build.sh OUTDIR [TOOL...]}"
shift
mkdir -p "$outdir"
outdir="$(cd "$outdir" && pwd)"
stamps="$outdir/.stamps"
mkdir -p "$stamps"

cd "$here"
if ! command -v go >/dev/null; then
	echo "build.sh: needs the go command (Go >= $(sed -n 's/^go //p' go.mod))" >&2
	exit 1
fi
# readonly: go.mod and go.sum are complete and committed, so a fresh clone
# builds without touching them; any drift is an error rather than a silent edit.
export GOFLAGS="-mod=readonly -buildvcs=false -trimpath"
export CGO_ENABLED=0
jobs="${TOOLS_GO_P:-2}"

modver() { go list -m -f '{{.Version}}' "$1"; }

k8s="$(modver k8s.io/kubernetes)"          # v1.37.2
k8s_minor="$(echo "$k8s" | cut -d. -f2)"
helm="$(modver helm.sh/helm/v3)"
kwok="$(modver sigs.k8s.io/kwok)"
kube_ldflags="-X k8s.io/component-base/version.gitVersion=$k8s \
-X k8s.io/component-base/version.gitMajor=1 \
-X k8s.io/component-base/version.gitMinor=$k8s_minor \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
-X k8s.io/client-go/pkg/version.gitVersion=$k8s \
-X k8s.io/client-go/pkg/version.gitMajor=1 \
-X k8s.io/client-go/pkg/version.gitMinor=$k8s_minor"
helm_ldflags="-X helm.sh/helm/v3/internal/version.version=$helm \
-X helm.sh/helm/v3/internal/version.gitTreeState=clean \
-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor \
-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"
kwok_ldflags="-X sigs.k8s.io/kwok/pkg/consts.Version=${kwok#v} \
-X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${k8s#v}"
# KEDA's version, read from its go.mod (a go list there would load its whole module graph).
keda="$(sed -n 's|^[[:space:]]*github.com/kedacore/keda/v2 \(v[^ ]*\).*|\1|p' keda/go.mod)"
keda_ldflags="-X github.com/kedacore/keda/v2/version.Version=$keda \
-X github.com/kedacore/keda/v2/version.GitCommit=$keda"
# This module's own packages (coredns/): their source is part of the stamp.
module="$(go list -m -f '{{.Path}}')"

# name | package | ldflags [| module directory under hack/tools, default: this one]. Order: the ones the tests cannot do without first.
tools=(
	"etcd|go.etcd.io/etcd/server/v3|"
	"kube-apiserver|k8s.io/kubernetes/cmd/kube-apiserver|$kube_ldflags"
	"helm|helm.sh/helm/v3/cmd/helm|$helm_ldflags"
	"kube-controller-manager|k8s.io/kubernetes/cmd/kube-controller-manager|$kube_ldflags"
	"kwok|sigs.k8s.io/kwok/cmd/kwok|$kwok_ldflags"
	"kubeconform|github.com/yannh/kubeconform/cmd/kubeconform|"
	# The node tier (tests/node): a real kubelet, scheduler and kube-proxy.
	"kube-scheduler|k8s.io/kubernetes/cmd/kube-scheduler|$kube_ldflags"
	"kube-proxy|k8s.io/kubernetes/cmd/kube-proxy|$kube_ldflags"
	"kubelet|k8s.io/kubernetes/cmd/kubelet|$kube_ldflags"
	# For a person debugging the node tier: kubectl logs / exec / get.
	"kubectl|k8s.io/kubernetes/cmd/kubectl|$kube_ldflags"
	# Cluster DNS for the node tier and the kind cluster: CoreDNS with only the
	# plugins the project's Corefiles use (coredns/main.go, in this module, so
	# its Kubernetes client packages are the ones compiled for the tools above).
	"coredns|$module/coredns|"
)
# Built only when named (hack/kind/node-image.sh asks for them): the kind CLI
# (from its own module, kind/go.mod) and what the kind node image holds besides
# the tools above (from this module: they share its Kubernetes packages).
on_request=(
	"kubeadm|k8s.io/kubernetes/cmd/kubeadm|$kube_ldflags"
	"kind|sigs.k8s.io/kind||kind"
	"crictl|sigs.k8s.io/cri-tools/cmd/crictl|-X sigs.k8s.io/cri-tools/pkg/version.Version=$(modver sigs.k8s.io/cri-tools)"
	"kube-router|github.com/cloudnativelabs/kube-router/v2/cmd/kube-router|-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$(modver github.com/cloudnativelabs/kube-router/v2)"
	# KEDA (docs/autoscaling.md), from its own module (keda/go.mod): its operator and
	# its metrics API server (the HPA's external metrics). Built by make autoscaling-images
	# (hack/image/autoscaling.sh), not by make tools.
	"keda-operator|github.com/kedacore/keda/v2/cmd/operator|$keda_ldflags|keda"
	"keda-adapter|github.com/kedacore/keda/v2/cmd/adapter|$keda_ldflags|keda"
)
[[ $# -gt 0 ]] && tools+=("${on_request[@]}")

pins_of() { (cd "$1" && cat go.mod go.sum && go env GOVERSION GOOS GOARCH && echo "$GOFLAGS"); }
# The source of a package of this module (none for packages from the proxy:
# go.sum pins those).
source_of() {
	case "$1" in
	"$module"/*) cat "$here/${1#"$module"/}"/*.go ;;
	esac
}
failed=()
for entry in "${tools[@]}"; do
	IFS='|' read -r name pkg ldflags moddir <<<"$entry"
	if [[ $# -gt 0 ]] && [[ " $* " != *" $name "* ]]; then
		continue
	fi
	dir="$here${moddir:+/$moddir}"
	stamp="$(printf '%s\n%s\n%s\n%s\n' "$(pins_of "$dir")" "$pkg" "$ldflags" "$(source_of "$pkg")" | sha256sum | cut -d' ' -f1)"
	if [[ -x "$outdir/$name" && -f "$stamps/$name" && "$(cat "$stamps/$name")" == "$stamp" ]]; then
		echo "build.sh: $name is up to date"
		continue
	fi
	echo "build.sh: building $name ($pkg)"
	start=$SECONDS
	rm -f "$stamps/$name"
	# Build to a temporary name: a half-written binary never looks usable.
	if (cd "$dir" && go build -p "$jobs" -ldflags "-s -w $ldflags" -o "$outdir/.$name.tmp" "$pkg"); then
		mv -f "$outdir/.$name.tmp" "$outdir/$name"
		echo "$stamp" >"$stamps/$name"
		echo "build.sh: built $name in $((SECONDS - start))s"
	else
		rm -f "$outdir/.$name.tmp"
		echo "build.sh: FAILED to build $name" >&2
		failed+=("$name")
	fi
done

# Source only, nothing to build: the Kubernetes OpenAPI document (in the
# k8s.io/kubernetes module the tools above come from) and the prometheus-operator
# CRD YAML, from which hack/devkit/fleetkit/cluster/chartkit.py makes kubeconform's schemas.
if [[ $# -eq 0 ]]; then
	(cd "$here" && go mod download k8s.io/kubernetes) || failed+=("k8s.io/kubernetes (download)")
	(cd "$here/prometheus-operator" && go mod download github.com/prometheus-operator/prometheus-operator) ||
		failed+=("prometheus-operator (download)")
fi

if [[ ${#failed[@]} -gt 0 ]]; then
	echo "build.sh: failed: ${failed[*]}" >&2
	exit 1
fi
