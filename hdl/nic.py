"""The MRC NIC top. It grows issue by issue; every block is wired in here as it lands.

Being rewired: the transport blocks (requester, responder, path select) go between the packet
engine's ``rx_packets`` and ``tx_packets``. Until then the top is the packet engine.
"""

from .packet.engine import PacketEngine

__all__ = ["MrcNic"]


class MrcNic(PacketEngine):
    """Multipath Reliable Connection NIC (today: the packet engine, ``hdl/packet/engine.py``)."""
