"""Stream payloads shared between the NIC's blocks: the contracts the blocks are built against.

Every layout is a function of :class:`~hdl.config.NicConfig`, so a QP number, an EV index or a
PSN has the same width on both ends of every ``connect``. The blocks that produce and consume
each stream are named in its docstring; ``docs/nic.md`` draws them.
"""

from amaranth.hdl import unsigned
from amaranth.lib import data

from . import protocol as P
from .packet.headers import PORT_BITS

__all__ = [
    "work_request_layout", "completion_layout", "fetch_request_layout", "fetch_beat_layout",
    "place_beat_layout", "path_request_layout", "path_decision_layout", "ev_fields_layout",
    "feedback_layout", "CompletionSide", "EV_VALUE_BITS", "expand_request_layout",
    "expand_response_layout", "generate_request_layout", "generate_response_layout",
]

PSN = unsigned(P.PSN_BITS)


def work_request_layout(config):
    """A work request (requester input): ``qpn`` is the local QP index.

    ``local_addr`` is where the payload is fetched from, ``remote_addr``/``rkey`` where it is
    written at the responder, ``imm`` the immediate of a WRITE WITH IMMEDIATE.
    """
    return data.StructLayout({
        "qpn": unsigned(config.qpn_bits),
        "opcode": P.WrOpcode,
        "wr_id": unsigned(64),
        "local_addr": unsigned(64),
        "remote_addr": unsigned(64),
        "rkey": unsigned(32),
        "length": unsigned(32),
        "imm": unsigned(32),
    })


class CompletionSide:
    REQUESTER = 0
    RESPONDER = 1


def completion_layout(config):
    """A work completion. Requester completions (``side`` 0) carry the ``wr_id`` of the work
    request; responder completions (``side`` 1, WRITE WITH IMMEDIATE only) carry the ``imm``
    and the message's MSN in ``wr_id``."""
    return data.StructLayout({
        "qpn": unsigned(config.qpn_bits),
        "side": unsigned(1),
        "wr_id": unsigned(64),
        "status": P.CompletionStatus,
        "opcode": P.WcOpcode,
        "byte_len": unsigned(32),
        "imm_valid": unsigned(1),
        "imm": unsigned(32),
    })


def fetch_request_layout(config):
    """Payload fetch request (requester -> host memory): ``length`` bytes from ``addr``; at most
    one MTU. Answered by beats of :func:`fetch_beat_layout`, in request order."""
    return data.StructLayout({
        "addr": unsigned(64),
        "length": unsigned(16),
    })


def fetch_beat_layout(config):
    """Fetched payload: byte i of the request is at lane i of the stream (lane 0 of the first
    beat first); every beat is full except the last (``keep`` from lane 0)."""
    return data.StructLayout({
        "data": unsigned(config.data_width),
        "keep": unsigned(config.data_width // 8),
        "last": unsigned(1),
    })


def place_beat_layout(config):
    """Placement write (responder -> host memory): lane i of ``data`` goes to byte address
    ``addr + i`` when ``keep`` bit i is set. ``last`` ends a packet's payload."""
    return data.StructLayout({
        "addr": unsigned(64),
        "data": unsigned(config.data_width),
        "keep": unsigned(config.data_width // 8),
        "last": unsigned(1),
    })


def ev_fields_layout(config):
    """An expanded EV as the header builder places it (:mod:`hdl.path.expand`)."""
    return data.StructLayout({
        "flow_label": unsigned(20),             # STEV
        "udp_sport": unsigned(16),              # STEV, UDP
        "srv6_valid": unsigned(1),              # SRv6: outer IPv6 destination
        "srv6_dst": unsigned(128),
        "srh_valid": unsigned(1),               # SRv6 with a second segment
        "srh_segment": unsigned(128),
    })


def path_request_layout(config, context=None):
    """A send request to path selection (requester -> path select): pick an EV for ``qpn``.

    ``avoid_ev_valid``/``avoid_ev``: a retransmission must not reuse the EV that lost it.
    ``probe``: a probe may use an ASSUMED_BAD EV (``ev`` names it; selection is skipped).
    ``context`` is carried through unchanged for the consumer.
    """
    fields = {
        "qpn": unsigned(config.qpn_bits),
        "avoid_ev_valid": unsigned(1),
        "avoid_ev": unsigned(config.ev_index_bits),
        "probe": unsigned(1),
        "ev": unsigned(config.ev_index_bits),
    }
    if context is not None:
        fields["context"] = context
    return data.StructLayout(fields)


def path_decision_layout(config, context=None):
    """The decision for one send request (path select -> transmit), in request order.

    ``no_path``: no usable EV (every EV DENIED or ASSUMED_BAD with the floor exhausted); the
    consumer must not send data and counts it.
    """
    fields = {
        "qpn": unsigned(config.qpn_bits),
        "no_path": unsigned(1),
        "ev": unsigned(config.ev_index_bits),
        "port": unsigned(PORT_BITS),            # 0-based here; EV entries name ports 1..P
        "fields": ev_fields_layout(config),
    }
    if context is not None:
        fields["context"] = context
    return data.StructLayout(fields)


def feedback_layout(config):
    """Path feedback (ACK/NACK processing, retransmit timer, probes -> path select)."""
    return data.StructLayout({
        "qpn": unsigned(config.qpn_bits),
        "ev": unsigned(config.ev_index_bits),
        "kind": P.FeedbackKind,
    })


# ---------------------------------------------------------------------------------------------
# Path selection <-> EV expansion/generation (hdl.path.select <-> hdl.path.expand)
# ---------------------------------------------------------------------------------------------

EV_VALUE_BITS = 8 * P.EV_MAX_BYTES      #: an EV value: 32 bytes, byte 0 in the top bits


def expand_request_layout(config):
    """Expand ``value`` (an EV, byte 0 in bits 255..248, short EVs zero-padded on the right)
    with the definitions of EV profile ``profile``. ``tag`` comes back in the response."""
    return data.StructLayout({
        "profile": unsigned(config.profile_bits),
        "value": unsigned(EV_VALUE_BITS),
        "tag": unsigned(9),
    })


def expand_response_layout(config):
    """``errno`` OK: ``fields``/``image`` hold the expansion (``image`` is the 256-bit
    left-aligned image of :func:`hdl.path.ev.expand`, byte 0 in the top bits). EINVAL: the EV
    has a 1 after the consumed bits, or the profile has no valid definitions."""
    return data.StructLayout({
        "errno": P.Errno,
        "fields": ev_fields_layout(config),
        "image": unsigned(EV_VALUE_BITS),
        "tag": unsigned(9),
    })


def generate_request_layout(config):
    """Generate EV number ``index`` of GENERATED profile ``profile`` (as
    ``hdl.path.ev.generate(profile, index + 1)[index]``)."""
    return data.StructLayout({
        "profile": unsigned(config.profile_bits),
        "index": unsigned(9),
    })


def generate_response_layout(config):
    """``errno`` OK: ``value`` is the EV (byte 0 in the top bits, zero-padded). E2BIG: the
    profile makes fewer than ``index + 1`` distinct EVs. EINVAL: not a valid GENERATED
    profile."""
    return data.StructLayout({
        "errno": P.Errno,
        "value": unsigned(EV_VALUE_BITS),
    })
