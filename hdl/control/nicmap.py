"""The NIC's register map: one description, from which the bus decoder (``hdl/nic.py``), the
driver (``sim/driver``) and ``docs/registers.md`` are all generated."""

from amaranth.hdl import unsigned
from amaranth.lib import data

from .. import protocol as P
from ..packet.headers import DropReason
from .regmap import CommandBlock, ControlBlock, QueueBlock, RegisterMap, StatusBlock

__all__ = ["nic_register_map", "NIC_SETTINGS", "TX_COUNTERS", "counter_layout"]

#: Counters of the transmit side and the receive demultiplexer.
TX_COUNTERS = ("tx_length_errors", "tx_bad_port", "no_path", "rx_unrouted",
               "probe_results_dropped", "port_downs", "port_watch_overflows",
               "probe_unknown_ids")


def counter_layout(names):
    return data.StructLayout({name: unsigned(32) for name in names})


def NIC_SETTINGS(config):
    """NIC-wide settings (a control block) and their reset values."""
    from ..path.watch import WATCH_WINDOW_BITS
    layout = data.StructLayout({"trim_dscp": unsigned(6),
                                "port_wnd": unsigned(WATCH_WINDOW_BITS),
                                "port_quiet": unsigned(WATCH_WINDOW_BITS)})
    return layout, {"trim_dscp": config.trim_dscp, "port_wnd": 0, "port_quiet": 0}


def nic_register_map(config):
    """The register map of :class:`hdl.nic.MrcNic` for ``config``."""
    from ..path.expand import DefineOp, define_request_layout, define_response_layout
    from ..path.probe import probe_command_layout, probe_result_layout
    from ..path.select import COUNTERS as PATH_COUNTERS
    from ..path.select import (
        PathCommand,
        path_command_layout,
        path_event_layout,
        path_response_layout,
    )
    from ..transport.req_defs import (
        REQUESTER_COUNTERS,
        RequesterCommand,
        qp_error_layout,
        requester_command_layout,
        requester_response_layout,
    )
    from ..transport.resp_defs import (
        RESPONDER_COUNTERS,
        ResponderCommand,
        responder_command_layout,
        responder_response_layout,
    )
    from ..transport.txformer import TxCommand, tx_command_layout

    settings, settings_init = NIC_SETTINGS(config)
    errno_only = data.StructLayout({"errno": P.Errno})
    return RegisterMap([
        ControlBlock("settings", settings, "NIC-wide settings: the DSCP of trimmed packets; "
                     "the port watch's window and quiet time (1.024 us units; window 0: off; "
                     "docs/recovery.md, Port watch).", init=settings_init),
        CommandBlock("requester", requester_command_layout(config),
                     requester_response_layout(config),
                     "Requester QP attributes and settings (docs/requester.md).",
                     commands=RequesterCommand),
        CommandBlock("responder", responder_command_layout(config),
                     responder_response_layout(config),
                     "Responder QP attributes, memory regions and ACK settings "
                     "(docs/responder.md).", commands=ResponderCommand),
        CommandBlock("path", path_command_layout(config), path_response_layout(config),
                     "EV profiles, EV entries and QP bindings (docs/path-select.md).",
                     commands=PathCommand),
        CommandBlock("ev_define", define_request_layout(config),
                     define_response_layout(config),
                     "EV format and field definitions (docs/ev-expansion.md, In hardware).",
                     commands=DefineOp),
        CommandBlock("tx", tx_command_layout(config), errno_only,
                     "Per-QP peer addresses and the NIC's own addresses.", commands=TxCommand),
        CommandBlock("probe", probe_command_layout(config), errno_only,
                     "Send a probe on an EV (docs/probes.md)."),
        QueueBlock("ev_events", path_event_layout(config),
                   "EV events: GOOD <-> ASSUMED_BAD changes (drops counted in path "
                   "counters.events_dropped)."),
        QueueBlock("probe_results", probe_result_layout(config), "Answered probes."),
        QueueBlock("qp_errors", qp_error_layout(config),
                   "QPs the requester moved to ERROR, with the status: the fatal NAK's, or "
                   "RETRY_EXC_ERR when the retransmit timer ran out of retries."),
        StatusBlock("rx_counters", counter_layout(r.name.lower() for r in DropReason),
                    "Parser: frames accepted (`none`) and dropped per reason "
                    "(docs/parser.md)."),
        StatusBlock("tx_counters", counter_layout(TX_COUNTERS),
                    "NIC-level counters: transmit errors, packets no path or receive route "
                    "took, probe results dropped on a full result FIFO (docs/probes.md), "
                    "ports the port watch reported down and sends it could not remember "
                    "(docs/recovery.md, Port watch), EV probe answers whose id named no "
                    "outstanding probe (docs/probes.md)."),
        StatusBlock("requester_counters", counter_layout(REQUESTER_COUNTERS),
                    "Requester counters (docs/requester.md)."),
        StatusBlock("responder_counters", counter_layout(RESPONDER_COUNTERS),
                    "Responder counters (docs/responder.md)."),
        StatusBlock("path_counters", counter_layout(PATH_COUNTERS),
                    "Path-select counters (docs/path-select.md)."),
    ], title="MRC NIC register map")
