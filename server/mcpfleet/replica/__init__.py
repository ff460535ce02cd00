"""One replica, one job per module, from the process to the request:

* ``process``: the replica process (the key ring read, uvicorn, SIGTERM drains
  first); ``runtime``: the replica (any FastMCP app, the shared key ring, the
  registry); ``wiring``: its parts made from its settings (limits, SSE event
  store, tasks); ``drain``: its graceful drain; ``appload``: loading the user's
  FastMCP app by ``module:attribute`` and fitting it with the fleet's codec;
* ``gate``: the front door (health, readiness and drain, the replica header,
  session bookkeeping); ``limitgate``: the limits per principal at that door;
  ``hostcheck``: FastMCP's Host/Origin guard with its verdicts kept;
* ``respmode``: which response mode answers each request (JSON for a modern
  round that cannot stream);
* ``middleware``: the Prometheus metrics of every round of the app's tools,
  prompts and resources; ``metrics``: the replica's own Prometheus metrics;
  ``taskmetrics``: those of an app's MCP tasks, in the same registry;
  ``tracing``: the replica's span of each request; ``spans``: FastMCP's span
  helpers made free while its spans are off; ``toollookup``: FastMCP's tool
  lookup without a task group for one local provider; ``roundparams``: a
  round's input responses and state parsed once a request; ``infront``: how
  those two are put in front of FastMCP's own methods, and only of its own.
"""
