"""The sticky router, one job per module, from the process down to the bytes:

* ``process``: the router process (uvicorn, its signals); ``proxy``: the ASGI
  application, its lifecycle, and the dispatch of each admitted request;
* ``admission``: the judgement of each request before it is routed;
  ``exchange``: a request as one value, and the answers the router makes itself;
* ``sticky``: a session's request, to its owner; ``spread``: ``initialize``
  placed by load, every other sessionless request spread; ``resend``: the one
  loop that tries replica after replica while none can have received a request;
  ``forward``: one request to one replica, with the books kept around it;
* ``rehome``: whether a session whose owner is gone may move; ``move``: the
  404 that ends such a session, or the move this router leads; ``gone``: why an
  owner counts as gone, and why a session was not moved; ``reinit``:
  re-opening a session on a replica;
* ``route``: a session's route (its owner, and the owner's id for it) and its
  stored form; ``table``: the session table; ``replicas``: the replica view;
  ``health``: Redis reachability (degraded, not closed);
* ``decisions``: the pure routing decisions; ``refused``: credentials a replica
  refused under a rate, refused here until their time; ``metrics``: the
  router's Prometheus metrics;
* ``upstream``: the forwarding to a replica and the relay back; ``h1client``: its
  HTTP/1.1 client; ``h1server``: the router's own HTTP protocol with read timeouts.
"""
