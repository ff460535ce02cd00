"""``python -m fleetkit.cluster up|down|status``: see :mod:`fleetkit.cluster.standing`."""

import sys

from fleetkit.cluster.standing import main

sys.exit(main())
