"""Local development: the local fleet behind ``mcpfleet dev`` (``fleet``), its
supervisor (``supervisor``), the booking flow ``mcpfleet demo`` runs through a
fleet (``booking``), a local Prometheus (``localprom``), the ports their
processes listen on (``ports``) and polling until a condition holds (``wait``)."""
