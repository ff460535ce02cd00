"""The rigs the test tiers, ``make cluster-up``, ``make kind-up`` and the bench drive.

Not part of the product (it is not in the wheel): the tests import it through
``hack/devkit`` on their path, and so do the replica processes that serve its
apps. What is where, each layer importing only the ones below it (checked by
``tests/rigs/test_devkit_imports.py``):

- :mod:`fleetkit.conformance`: the official MCP conformance suite, run
  against one replica, the fleet and a rotating fleet.
- :mod:`fleetkit.cluster`: a real Kubernetes on this machine (control plane,
  node, kind, helm, the chart, RBAC, the operator) and the ``Fleet`` backends
  that run on it.
- the modules here: the ``Fleet`` interface and its local backend
  (:mod:`fleetkit.fleet`), the scenarios written once against it
  (:mod:`fleetkit.scenarios`), Redis as users run it (:mod:`fleetkit.redisrig`,
  :mod:`fleetkit.failover`), throwaway certificates (:mod:`fleetkit.certs`),
  the committed dashboards read as data (:mod:`fleetkit.monitoring`), what
  a failing test prints (:mod:`fleetkit.failure`) and the fault tier's table
  (:mod:`fleetkit.faulttable`).
- :mod:`fleetkit.clients` and :mod:`fleetkit.apps`, side by side: what the
  tests send (raw wire exchanges, sessions that never re-initialize, MCP tasks,
  traffic under load, JWTs) and the FastMCP apps replicas serve in the tests
  (``--app fleetkit.apps.<name>:app``).
"""
