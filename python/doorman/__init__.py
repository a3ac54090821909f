"""doorman: a client of a doorman capacity tree (docs/python.md). Standard library only."""

from ._core import ResourceOptions
from ._limiters import NO_SLOT, Acquired
from .client import (
    BudgetResource,
    Client,
    ClientClosed,
    GaugeResource,
    RateResource,
    tls_context,
)

__all__ = [
    "Acquired",
    "BudgetResource",
    "Client",
    "ClientClosed",
    "GaugeResource",
    "NO_SLOT",
    "RateResource",
    "ResourceOptions",
    "tls_context",
]
__version__ = "0.1.0"
