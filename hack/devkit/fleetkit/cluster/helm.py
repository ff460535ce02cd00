"""The helm built from the pinned Go module (``make tools``), run with dirs of its own.

:class:`Helm` never reads the user's helm cache, config or plugins, nor a
``KUBE*`` or ``HELM_*`` variable of the calling environment: a test's helm
sees exactly the kubeconfig it was given.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


class HelmError(RuntimeError):
    pass


@dataclass(frozen=True)
class Helm:
    """The built helm with its own cache/config/data dirs (never the user's)."""

    binary: Path
    home: Path
    kubeconfig: Path | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBE"))}
        env |= {
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def run(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``helm ARGS``; :class:`HelmError` (with stderr) when it fails."""
        result = subprocess.run(
            [str(self.binary), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise HelmError(
                f"helm {' '.join(args)} exited {result.returncode}\n"
                f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            )
        return result
