"""``python -m fleetkit.conformance``: see :mod:`fleetkit.conformance.suite`."""

from fleetkit.conformance.suite import main

raise SystemExit(main())
