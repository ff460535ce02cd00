"""The key ring: its file format and rotation steps (``ring``), the Secret-volume
files it is read from (``files``), the watcher that hot-reloads it (``watch``), and
the request-state codec that seals and opens tokens with it (``codec``)."""
