"""The sticky router: pure routing decisions (``decisions``), the replica view and
the session table (``table``), the proxy (``proxy``), its HTTP protocol with read
timeouts (``http``) and its Prometheus metrics (``metrics``)."""
