"""mcpfleet's key ring operator (kopf): distributes and rotates the request-state keys.

The package lives in the source root ``operator/`` (the folder itself is not a
package, so ``import operator`` always finds the standard library). It runs
as ``mcpfleet operator`` and ``mcpfleet rotate`` (the ``[operator]`` extra),
registered through the ``mcpfleet.commands`` entry point; the replicas never
import it. What it shares with them (file format, kid, Redis names, labels)
is ``mcpfleet.contract``.
"""
