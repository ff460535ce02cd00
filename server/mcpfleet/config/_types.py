"""How a flag's value is read: the argparse types the tables of flags name.

Each takes the flag's text and returns its value, or raises
:class:`argparse.ArgumentTypeError` with a line saying what was wrong.
"""

from __future__ import annotations

import argparse

from mcpfleet.contract import check_fleet_name


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def fleet_name(text: str) -> str:
    try:
        return check_fleet_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
