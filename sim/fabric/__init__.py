"""A multi-plane network model between two NICs: planes x paths, each with latency,
serialization and a queue (ECN, trimming, tail drop), random and burst loss, duplication,
reordering, corruption and a failure schedule. Seeded, event driven, simulator agnostic.
See ``docs/fabric.md``.
"""

from .config import FabricConfig, line_rate_gbps
from .fabric import Fabric, Record
from .schedule import BLACKHOLE, FLAP, Failure
from .stats import MARKS, OUTCOMES, Statistics

__all__ = ["Fabric", "FabricConfig", "Failure", "Record", "Statistics", "line_rate_gbps",
           "BLACKHOLE", "FLAP", "OUTCOMES", "MARKS"]
