"""Python driver over the NIC's register bus (``hdl/control``), for every bench.

:class:`RegisterDriver` knows the register map (from its generated description) and turns
``await driver.command("responder", op=..., qpn=...)`` into argument writes, a ``GO`` and a
status poll, returning the decoded response or raising :class:`DriverError` with the errno
name the block answered. Bus access is injected: :class:`AmaranthBus` for the Amaranth
simulator, ``sim.tb`` adapters for cocotb.
"""

from .core import AmaranthBus, DriverError, RegisterDriver

__all__ = ["RegisterDriver", "DriverError", "AmaranthBus"]
