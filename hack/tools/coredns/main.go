// CoreDNS with only the plugins mcpfleet's Corefiles use: the node tier's
// (tests/fleetkit/node.py: bind, errors, ready, kubernetes, cache) and the one
// kubeadm writes in the kind node image (errors, health, ready, kubernetes,
// prometheus, forward, cache, loop, reload, loadbalance), plus log, hosts and
// whoami for a person debugging DNS. This is CoreDNS's compile-time plugin
// selection: coremain with a chosen set of plugin imports and
// dnsserver.Directives in the order of CoreDNS's own plugin.cfg. Leaving out
// the cloud-DNS plugins (route53, azure, clouddns, etcd, ...) is what lets this
// package live in ../go.mod and share the compiled Kubernetes client packages
// with the kube-* binaries.
//
// A Corefile naming a plugin left out fails at start with CoreDNS's
// "Unknown directive" error; `coredns -plugins` lists what is built in.
package main

import (
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

// directives is CoreDNS v1.15.0's plugin.cfg order (core/dnsserver/zdirectives.go)
// restricted to the plugins imported above: a plugin sees the effect of every
// plugin after it in this list, so the order must stay CoreDNS's. "prometheus"
// is the directive of plugin/metrics.
var directives = []string{
	"reload",
	"bind",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"hosts",
	"kubernetes",
	"loop",
	"forward",
	"whoami",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
