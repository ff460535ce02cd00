"""Reading py-spy's ``--format raw`` output (collapsed stacks): where a process's time goes.

Each line is ``frame;frame;...;leaf count``, outermost first, a frame being
``function (file:line)``. Self time is the leaf's; inclusive time counts a
function once per stack it appears in (recursion not double counted).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def frame_name(frame: str) -> str:
    """A frame without its line: ``f (a/b.py:552)`` -> ``f (a/b.py)``."""
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip()
    return f"{m['func']} ({m['file']})"


@dataclass
class Profile:
    samples: int
    self_time: Counter[str]
    inclusive: Counter[str]

    def top_self(self, n: int) -> list[tuple[str, float]]:
        return [(f, c / self.samples) for f, c in self.self_time.most_common(n)]

    def top_inclusive(self, n: int, within: str = "") -> list[tuple[str, float]]:
        return [(f, c / self.samples) for f, c in self.inclusive.most_common() if within in f][:n]


def read_collapsed(lines: Iterable[str]) -> Profile:
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    samples = 0
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        samples += count
        self_time[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    return Profile(samples, self_time, inclusive)
