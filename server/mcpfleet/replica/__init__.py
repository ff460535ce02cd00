"""One replica: the process runtime (``runtime``), the readiness and drain gate
(``gate``), loading the user's FastMCP app (``appload``), the rounds middleware
(``middleware``) and the replica's own Prometheus metrics (``metrics``)."""
