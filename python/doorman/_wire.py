"""Doorman's JSON-RPC lines (docs/protocol.md): requests out, answers checked on the way in.

An answer is as untrusted as a request: a grant is adopted only if it names a resource the
request asked for, once, with every number within the protocol's bounds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Optional

MAX_QUANTITY = 1e15  # capacities and wants
MAX_SECONDS = 1e6  # expires_in and refresh_interval
MAX_ID_BYTES = 256


@dataclass(frozen=True)
class Lease:
    """What the server granted: `capacity` until `expires_in` seconds after the request was sent,
    to be asked again after `refresh_interval` seconds."""

    capacity: float
    expires_in: float
    refresh_interval: float


@dataclass(frozen=True)
class Grant:
    resource_id: str
    lease: Lease
    safe_capacity: Optional[float]  # None: the server gave none (-1: unlimited)


@dataclass(frozen=True)
class Mastership:
    is_master: bool
    master: Optional[str]


def request_line(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    """One request, as one line."""
    return (
        json.dumps(
            {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params},
            separators=(",", ":"),
            allow_nan=False,
        )
        + "\n"
    ).encode()


def _number(v: Any, low: float, high: float) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        x = float(v)
    except OverflowError:  # an integer too large for a float
        return None
    return x if math.isfinite(x) and low <= x <= high else None


def read_mastership(result: Any) -> Optional[Mastership]:
    """The `mastership` of a result, or None when it is not one."""
    if not isinstance(result, dict):
        return None
    m = result.get("mastership")
    if not isinstance(m, dict) or not isinstance(m.get("is_master"), bool):
        return None
    master = m.get("master")
    return Mastership(m["is_master"], master if isinstance(master, str) and master else None)


def check_id(value: str, name: str) -> None:
    """Raises ValueError, naming the field, for an id the protocol refuses."""
    if not isinstance(value, str) or not 1 <= len(value.encode()) <= MAX_ID_BYTES:
        raise ValueError(f"{name}: must be a string of 1 to {MAX_ID_BYTES} bytes")


def read_grants(result: dict[str, Any], asked: set[str]) -> tuple[list[Grant], list[str]]:
    """The grants of a `get_capacity` result that pass the checks, and why the others did not
    (`resources[1].resource_id: granted twice`)."""
    grants: list[Grant] = []
    problems: list[str] = []
    seen: set[str] = set()
    items = result.get("resources")
    if not isinstance(items, list):
        return grants, ["resources: must be an array"]
    for i, g in enumerate(items):
        at = f"resources[{i}]"
        if not isinstance(g, dict):
            problems.append(f"{at}: must be an object")
            continue
        rid = g.get("resource_id")
        if not isinstance(rid, str) or rid not in asked:
            problems.append(f"{at}.resource_id: not asked for")
            continue
        if rid in seen:
            problems.append(f"{at}.resource_id: granted twice")
            continue
        gets = g.get("gets")
        if not isinstance(gets, dict):
            problems.append(f"{at}.gets: must be an object")
            continue
        capacity = _number(gets.get("capacity"), 0, MAX_QUANTITY)
        expires_in = _number(gets.get("expires_in"), 0, MAX_SECONDS)
        interval = _number(gets.get("refresh_interval"), 0, MAX_SECONDS)
        if capacity is None or expires_in is None or interval is None:
            problems.append(f"{at}.gets: a number out of bounds")
            continue
        safe: Optional[float] = None
        if "safe_capacity" in g:
            safe = _number(g["safe_capacity"], -1, MAX_QUANTITY)
            if safe is None or (safe < 0 and safe != -1):
                problems.append(f"{at}.safe_capacity: must be between 0 and 1e15, or -1")
                continue
        seen.add(rid)
        grants.append(Grant(rid, Lease(capacity, expires_in, interval), safe))
    return grants, problems
