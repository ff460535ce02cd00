"""FastMCP apps the replicas serve in the tests: ``--app fleetkit.apps.<name>:app``.

Each is written as an app author would write it; the tests count what its tools
did (side effects in a file, answers of a given size) rather than trusting answers.
"""
