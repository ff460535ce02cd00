"""Tools that read the product's sources as text, never importing them.

Not part of the product (it is not in the wheel), like :mod:`fleetkit` and
:mod:`benchkit` beside it:

- :mod:`codekit.walk`: ``make walk``, the walk of a session id from the
  router's entry point through the functions that receive it, with the stops
  it makes and how often it goes back to a file it came through; over
- :mod:`codekit.flow`: how a value flows through a function's body, call by
  call, in evaluation order; over
- :mod:`codekit.index`: the package's modules parsed, and what a name means
  where it is written.
"""
