"""The sticky router: pure routing decisions (``decisions``), the replica view and
the session table (``table``), the judgement of each request before it is routed
(``admission``), the proxy that decides and keeps the books (``proxy``), the
forwarding to a replica and back (``upstream``), its HTTP protocol with read
timeouts (``http``) and its Prometheus metrics (``metrics``)."""
