"""Deprecated: the import path ``mcpfleet.server``, removed in mcpfleet 0.2.0.

In 0.1.0 the package was installed as ``mcpfleet.server`` (its folder was
mapped there). Every module now lives one level up: ``mcpfleet.server.guard``
is ``mcpfleet.guard``, and the public API is ``from mcpfleet import ...``.
Importing ``mcpfleet.server`` (or any ``mcpfleet.server.<module>``, e.g. an app
given as ``mcpfleet.server.example.app:app``) warns once and hands back the
module under its new name (the example apps' is ``mcpfleet_examples.<module>``:
they left the package, :data:`mcpfleet.config.MOVED_APP_MODULES`): the very
same module object, never a second copy (a second copy would register its
Prometheus metrics twice and break ``is`` checks on its types). It goes away
in :data:`REMOVED_IN` (the next minor release after 0.1.0; CHANGELOG.md says
so too).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from mcpfleet.config import moved_app_module

_OLD = "mcpfleet.server."
#: The release that no longer has this import path.
REMOVED_IN = "0.2.0"

warnings.warn(
    f"the import path mcpfleet.server is deprecated and is removed in mcpfleet {REMOVED_IN}: "
    "import from mcpfleet (mcpfleet.server.<module> is mcpfleet.<module>)",
    DeprecationWarning,
    stacklevel=2,
)


class _Alias(importlib.abc.Loader):
    """Loads ``mcpfleet.server.<x>`` as the module ``mcpfleet.<x>``."""

    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self._target)

    def exec_module(self, module: ModuleType) -> None:
        """The target module was executed when it was imported under its own name."""


class _OldPaths(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_OLD):
            return None
        new = "mcpfleet." + fullname[len(_OLD) :]
        new = moved_app_module(new) or new
        if importlib.util.find_spec(new) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
    sys.meta_path.insert(0, _OldPaths())


def __getattr__(name: str) -> Any:
    import mcpfleet

    return getattr(mcpfleet, name)
