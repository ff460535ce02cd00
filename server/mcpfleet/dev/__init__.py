"""Local development: the local fleet behind ``mcpfleet dev`` (``fleet``), its
supervisor (``supervisor``), the demo client (``demo``) and a local Prometheus
(``localprom``)."""
