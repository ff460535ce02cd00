"""A real Kubernetes on this machine, and the ``Fleet`` backends that run on it.

The control plane (:mod:`~fleetkit.cluster.controlplane`, with :mod:`~fleetkit.cluster.pods`,
:mod:`~fleetkit.cluster.rbac` and :mod:`~fleetkit.cluster.kubelet_secret` standing in
for what a kubelet does), a real node (:mod:`~fleetkit.cluster.node`,
:mod:`~fleetkit.cluster.node_host`, :mod:`~fleetkit.cluster.nodeload`), kind
(:mod:`~fleetkit.cluster.kind`), the providers of the end-to-end tier
(:mod:`~fleetkit.cluster.providers`), helm and the chart
(:mod:`~fleetkit.cluster.helm`, :mod:`~fleetkit.cluster.chartkit`), the operator
(:mod:`~fleetkit.cluster.operatorkit`); the ``Fleet`` backends on them
(:mod:`~fleetkit.cluster.cpfleet`, :mod:`~fleetkit.cluster.nodefleet`,
:mod:`~fleetkit.cluster.chartfleet`); and ``python -m fleetkit.cluster``
(``make cluster-up`` / ``make cluster-down``: :mod:`~fleetkit.cluster.standing`).
"""
