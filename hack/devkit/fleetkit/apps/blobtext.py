"""The text of the test apps' ``blob`` tools: any length, no run of it repeated.

A relay that dropped, repeated or reordered any part of a large answer gives
a different text; the tests compare it with :func:`blob_text` of the size
they asked for.
"""

from __future__ import annotations

import hashlib


def blob_text(size: int) -> str:
    """``size`` characters of hexadecimal text, the same for the same ``size``."""
    return hashlib.shake_256(b"mcpfleet-blob").hexdigest((size + 1) // 2)[:size]
