"""What the tests send to a fleet, below the FastMCP client or around it.

Raw 2026-07-28 exchanges (:mod:`~fleetkit.clients.wire`), handshake sessions
that never re-initialize (:mod:`~fleetkit.clients.rawsession`), MCP tasks on
the wire (:mod:`~fleetkit.clients.taskwire`), users under load
(:mod:`~fleetkit.clients.traffic`) and the JWTs they present
(:mod:`~fleetkit.clients.jwtkit`).
"""
