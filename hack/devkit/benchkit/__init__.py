"""``make bench``: speed and memory measured side by side, printed as one table of ratios.

The harness lives apart from :mod:`fleetkit` (the rigs the tests run on): it
drives those rigs with load generators, profilers and the reference nginx, and
asserts nothing about speed; figures are compared as ratios in its table.
"""
