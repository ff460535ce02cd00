"""The log lines' trace ids: a filter that puts the current span's ids on every
record, and a formatter that shows them (both installed by the package's
``configure``, only when tracing is on).
"""

from __future__ import annotations

import logging
from typing import Final


class TraceIdFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (hex, or "" with no span) to every record,
    so a format may show them (``%(trace_id)s``) and a JSON formatter finds them.

    Installed on the root logger's handlers by :func:`configure`, only when
    tracing is on: otherwise records are left as they are.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from opentelemetry import trace

        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            record.trace_id = f"{ctx.trace_id:032x}"
            record.span_id = f"{ctx.span_id:016x}"
        else:
            record.trace_id = record.span_id = ""
        return True


TRACE_IDS: Final = TraceIdFilter()


class WithTraceIds(logging.Formatter):
    """A handler's formatter, with `` trace_id=... span_id=...`` after each line
    logged while a span is current (set by :func:`configure` when tracing is on)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        trace_id = getattr(record, "trace_id", "")
        if not trace_id:
            return text
        return f"{text} trace_id={trace_id} span_id={getattr(record, 'span_id', '')}"
