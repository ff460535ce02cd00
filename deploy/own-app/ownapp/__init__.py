"""An example of a team's own FastMCP app for the mcpfleet fleet: auth and one-time actions."""
