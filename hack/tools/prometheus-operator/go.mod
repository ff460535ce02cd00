// The prometheus-operator release whose CRD YAML (example/prometheus-operator-crd/)
// the chart's ServiceMonitors and PrometheusRule are validated against
// (tests/controlplane/test_chart_render_schemas.py, through kubeconform). Nothing is
// compiled: `make tools` only runs `go mod download` here; go.sum pins the module's hash.
module github.com/mcpfleet/mcpfleet/hack/tools/prometheus-operator

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
