// CoreDNS with only the plugins mcpfleet's Corefiles use: the node tier's
// (hack/devkit/fleetkit/cluster/node.py: bind, errors, ready, kubernetes, cache) and the one
// kubeadm writes in the kind node image (errors, health, ready, kubernetes,
// prometheus, forward, cache, loop, reload, loadbalance), plus log, hosts and
// whoami for a person debugging DNS. This is CoreDNS's compile-time plugin
// selection: coremain with a chosen set of plugin imports and
// dnsserver.Directives in the order of CoreDNS's own plugin.cfg (see init). Leaving out
// the cloud-DNS plugins (route53, azure, clouddns, etcd, ...) is what lets this
// package live in ../go.mod and share the compiled Kubernetes client packages
// with the kube-* binaries.
//
// A Corefile naming a plugin left out fails at start with CoreDNS's
// "Unknown directive" error; `coredns -plugins` lists what is built in.
package main

import (
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// dnsserver.Directives, as generated from CoreDNS's plugin.cfg, names every
// upstream plugin in the order a request passes through them (each plugin sees
// the effect of the ones after it). Keep that order, restricted to the
// plugins registered in this binary: the ones imported above and the few they
// import themselves (metadata, transfer, dnstap, debug). A Corefile naming any
// other plugin is then refused when it is parsed ("Unknown directive") rather
// than failing at setup, and `coredns -plugins` lists exactly what a Corefile
// may use. Main's init runs after every imported package's, so all plugins
// are registered by then.
func init() {
	var built []string
	for _, name := range dnsserver.Directives {
		if _, err := caddy.DirectiveAction("dns", name); err == nil {
			built = append(built, name)
		}
	}
	dnsserver.Directives = built
}

func main() {
	coremain.Run()
}
