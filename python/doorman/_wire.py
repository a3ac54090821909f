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
MAX_RESOURCES = 10_000  # resources in one request or answer
MAX_WINDOW_START = 1e11  # a budget's window start, Unix seconds
MAX_WINDOW_SECONDS = 366 * 86_400.0  # a budget's window length


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


@dataclass(frozen=True)
class RawGrant:
    """A grant as the answer carries it, its shape checked, its values not yet
    (`screen_grants`). An absent safe_capacity is 0, as the protocol's default."""

    resource_id: str
    capacity: float
    expires_in: float
    refresh_interval: float
    safe_capacity: float
    budget_window: Optional[int] = None  # a budget's window start, as the root names it


@dataclass(frozen=True)
class Answer:
    is_master: bool
    master: Optional[str]
    grants: list[RawGrant]


class _Bad(Exception):
    pass


def _field(obj: Any, key: str, path: str, required: bool = True) -> Any:
    v = obj.get(key)
    if v is None and required:
        raise _Bad(f"{path}.{key}: is required")
    return v


def _read_number(obj: dict[str, Any], key: str, path: str, required: bool = True) -> float:
    v = _field(obj, key, path, required)
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(f"{path}.{key}: must be a number")
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise _Bad(f"{path}.{key}: must be a finite number")
    return x


def _read_budget(g: dict[str, Any], at: str) -> Optional[int]:
    """A grant's optional `budget`, every field checked as the C++ codec does; its window."""
    b = g.get("budget")
    if b is None:
        return None
    at = f"{at}.budget"
    b = _object(b, at)
    window = _field(b, "window", at)
    if isinstance(window, bool) or not isinstance(window, int):
        raise _Bad(f"{at}.window: must be an integer")
    for key, most in (("window", MAX_WINDOW_START), ("reset", MAX_WINDOW_SECONDS),
                      ("limit", MAX_QUANTITY), ("spent", MAX_QUANTITY), ("left", MAX_QUANTITY)):
        if not 0 <= _read_number(b, key, at) <= most:
            raise _Bad(f"{at}.{key}: must be between 0 and {most:g}")
    return window


def _object(v: Any, path: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _Bad(f"{path}: must be an object")
    return v


def read_answer(result: Any) -> "Answer | str":
    """A `get_capacity` result, its shape checked as the C++ codec's `decode` does (a
    problem fails the whole answer), or the first problem, naming the field."""
    try:
        r = _object(result, "result")
        m = _object(_field(r, "mastership", "result"), "result.mastership")
        is_master = _field(m, "is_master", "result.mastership")
        if not isinstance(is_master, bool):
            raise _Bad("result.mastership.is_master: must be a boolean")
        master = m.get("master")
        if master is not None and not isinstance(master, str):
            raise _Bad("result.mastership.master: must be a string")
        items = _field(r, "resources", "result")
        if not isinstance(items, list):
            raise _Bad("result.resources: must be an array")
        if len(items) > MAX_RESOURCES:
            raise _Bad(f"result.resources: must hold at most {MAX_RESOURCES} elements")
        grants = []
        for i, g in enumerate(items):
            at = f"result.resources[{i}]"
            g = _object(g, at)
            rid = _field(g, "resource_id", at)
            if not isinstance(rid, str):
                raise _Bad(f"{at}.resource_id: must be a string")
            gets = _object(_field(g, "gets", at), f"{at}.gets")
            grants.append(RawGrant(
                rid,
                _read_number(gets, "capacity", f"{at}.gets"),
                _read_number(gets, "expires_in", f"{at}.gets"),
                _read_number(gets, "refresh_interval", f"{at}.gets"),
                _read_number(g, "safe_capacity", at, required=False),
                _read_budget(g, at),
            ))
        return Answer(is_master, master or None, grants)
    except _Bad as e:
        return f"bad answer: {e}"
    except RecursionError:  # nested past any answer's shape
        return "bad answer: nested too deep"


def screen_grants(grants: list[RawGrant], asked: set[str]) -> tuple[list[RawGrant], list[str]]:
    """The grants to adopt: for a resource the request asked for, the first for each, with
    every number within the protocol's bounds (the C++ `screen_grants`); and why the others
    were not (`resources[1].resource_id: granted twice`)."""
    adopted: list[RawGrant] = []
    problems: list[str] = []
    seen: set[str] = set()
    for i, g in enumerate(grants):
        problem = None
        if g.resource_id not in asked:
            problem = "resource_id: not asked for"
        elif g.resource_id in seen:
            problem = "resource_id: granted twice"
        elif not 0 <= g.capacity <= MAX_QUANTITY:
            problem = "gets.capacity: must be a finite number between 0 and 1e15"
        elif not 0 <= g.expires_in <= MAX_SECONDS:
            problem = "gets.expires_in: must be a finite number between 0 and 1e6"
        elif not 0 <= g.refresh_interval <= MAX_SECONDS:
            problem = "gets.refresh_interval: must be a finite number between 0 and 1e6"
        elif not (0 <= g.safe_capacity <= MAX_QUANTITY or g.safe_capacity == -1):
            problem = "safe_capacity: must be between 0 and 1e15, or -1 for unlimited"
        if problem is not None:
            problems.append(f"resources[{i}].{problem}")
            continue
        seen.add(g.resource_id)
        adopted.append(g)
    return adopted, problems
