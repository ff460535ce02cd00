"""The official MCP conformance suite against one replica, the fleet and a rotating fleet.

:mod:`~fleetkit.conformance.suite` installs and runs the pinned suite
(``python -m fleetkit.conformance``, ``make conformance``);
:mod:`~fleetkit.conformance.modern` makes the same calls on the 2026-07-28 era
through the router; :mod:`~fleetkit.conformance.tasks` runs the suite's
``tasks-*`` scenarios (``python -m fleetkit.conformance.tasks``).
"""
