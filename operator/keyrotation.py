"""Key ring rotation for the kopf operator (built by the operator issue)."""
