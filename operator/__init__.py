"""mcpfleet's kopf operator: distributes and rotates request-state key rings.

Imported as ``mcpfleet.operator``, never as ``operator``: a top-level package of
that name would shadow the standard library.
"""
