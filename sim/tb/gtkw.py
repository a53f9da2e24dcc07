"""A saved GTKWave view (``.gtkw``) for a waveform file, made from the names in the file.

For every NIC in the file (an instance whose ports include ``bus__addr`` and ``rx__0__valid``:
``nic_pair.nic_a`` and ``nic_pair.nic_b`` in the main job, the top ``mrc_nic`` in a replay) the
view has one group each for the register bus, the receive and the transmit ports (``valid``,
``ready``, ``first``, ``last`` per port), the host streams, and the transport: the ACKs into the
requester and its QP state and completions, the responder's verdicts and the ACKs it sends.
Only signals present in the file are listed, so the view follows the design as it is built;
in a file without a NIC the view lists the top module's ports.
"""

import re
from pathlib import Path

from .fst import read_header, signal_names

__all__ = ["write_view", "view_groups"]

#: Per NIC, relative to its instance: (group, signal patterns). ``{p}`` stands for each port;
#: a pattern is a regular expression matched against the whole relative name.
NIC_GROUPS = [
    ("register bus", [r"bus__addr", r"bus__w_en", r"bus__w_data", r"bus__r_en",
                      r"bus__r_data"]),
    ("RX ports", [r"rx__{p}__valid", r"rx__{p}__ready", r"rx__{p}__payload\.first",
                  r"rx__{p}__payload\.last"]),
    ("RX verdicts", [r"rx_verdict_valid", r"rx_verdict_reason"]),
    ("TX ports", [r"tx__{p}__valid", r"tx__{p}__ready", r"tx__{p}__payload\.first",
                  r"tx__{p}__payload\.last"]),
    ("host: work requests, completions, payload", [
        r"wr__valid", r"wr__ready", r"completion__valid", r"completion__ready",
        r"fetch_req__valid", r"fetch_req__ready", r"fetch__valid", r"fetch__ready",
        r"place__valid", r"place__ready"]),
    ("requester: ACKs in, QP state", [
        r"requester\.rx__valid", r"requester\.rx__ready", r"requester\.ack\.a1_valid",
        r"requester\.ack\.a1_qpn", r"requester\.ack\.a1_psn", r"requester\.ack\.a1_cum",
        r"requester\.ack\.a1_syndrome", r"requester\.completion\.e_qpn",
        r"requester\.completion\.e_state", r"requester\.completion\.e_una",
        r"requester\.completion\.e_error", r"requester\.ctl__valid",
        r"requester\.control\.ctl_state", r"requester\.send__valid", r"requester\.send__ready",
        r"requester\.completion__valid", r"requester\.qp_error__valid"]),
    ("responder: data in, ACKs out", [
        r"responder\.i__valid", r"responder\.i__ready", r"responder\.e_valid",
        r"responder\.e_qpn", r"responder\.e_kind", r"responder\.e_ack_want",
        r"responder\.ack_valid", r"responder\.ack__valid", r"responder\.ack__ready",
        r"resp_verdict_valid", r"resp_verdict"]),
    ("path select and port watch", [
        r"path\.i__valid", r"path\.o__valid", r"path\.feedback__valid",
        r"watch\.down_valid", r"watch\.down_port"]),
]

_RANGE = re.compile(r" ?\[\d+(:\d+)?\]$")


def _bare(name):
    """A name without the bit range Verilator appends (``x [7:0]`` -> ``x``)."""
    return _RANGE.sub("", name)


def _gtkw_name(name):
    """A name as GTKWave lists it: the range follows the name without a space."""
    return name.replace(" [", "[")


def _nics(bare):
    """Scopes that are NIC instances, in file order."""
    found = []
    for name in bare:
        if name.endswith(".bus__addr"):
            scope = name.removesuffix(".bus__addr")
            if not scope.startswith("$") and f"{scope}.rx__0__valid" in bare:
                found.append(scope)
    return found


def _ports(bare, scope):
    count = 0
    while f"{scope}.rx__{count}__valid" in bare:
        count += 1
    return count


def _top_ports(full, bare):
    """The top module's ports, sorted: Verilator lists them under ``$rootio``; otherwise the
    top scope's own signals without the ``$`` of generated names."""
    top = next((name.split(".", 1)[0] for name in full if not name.startswith("$")), None)
    if top is None:
        return []
    rootio = [f"{top}.{_bare(name).split('.', 1)[1]}" for name in full
              if name.startswith("$rootio.")]
    if rootio:
        chosen = [bare[name] for name in rootio if name in bare]
    else:
        chosen = [name for name in full if name.startswith(f"{top}.")
                  and "." not in _bare(name)[len(top) + 1:] and "$" not in name]
    return [("ports", sorted(chosen, key=_bare))] if chosen else []


def view_groups(names):
    """``[(group title, [signal names as in the file])]`` for the signal names of a file."""
    full = [name for name, _ in names]
    bare = {}
    for name in full:
        bare.setdefault(_bare(name), name)
    nics = _nics(bare)
    groups = []
    if not nics:
        return _top_ports(full, bare)
    clocks = [bare[f"{nics[0].rsplit('.', 1)[0]}.clk"]] if "." in nics[0] and \
        f"{nics[0].rsplit('.', 1)[0]}.clk" in bare else []
    if clocks:
        groups.append(("clock", clocks))
    for scope in nics:
        label = scope.rsplit(".", 1)[-1]
        ports = _ports(bare, scope)
        inside = [name for name in bare if name.startswith(f"{scope}.")]
        for title, patterns in NIC_GROUPS:
            chosen = []
            # Port by port: each port's valid, ready, first and last together.
            for port in range(ports) if any("{p}" in p for p in patterns) else [None]:
                for pattern in patterns:
                    wanted = re.compile(re.escape(scope) + r"\." +
                                        pattern.replace("{p}", str(port)) + "$")
                    chosen += [bare[b] for b in inside if wanted.match(b)
                               and bare[b] not in chosen]
            if chosen:
                groups.append((f"{label}: {title}", chosen))
    return groups


def write_view(fst, path=None):
    """Write the view of the FST file ``fst`` to ``path`` (default: beside it, ``.gtkw``);
    return its path."""
    fst = Path(fst).resolve()
    path = Path(path) if path else fst.with_suffix(".gtkw")
    names = signal_names(fst)
    widths = dict(names)
    header = read_header(fst)
    lines = [
        f"[*] mrc-nic: GTKWave view of {fst.name}, made from the signal names in the file",
        f'[dumpfile] "{fst}"',
        f'[savefile] "{path.resolve()}"',
        f"[timestart] {header.start}",
        "[size] 1600 1000",
        "[pos] -1 -1",
        "[sst_width] 260",
        "[signals_width] 380",
        "[sst_expanded] 1",
        "[sst_vpaned_height] 300",
    ]
    for title, signals in view_groups(names):
        lines += ["@800200", f"-{title}"]
        flags = None
        for name in signals:
            wanted = "@28" if widths[name] == 1 else "@22"   # binary bit, hex vector
            if wanted != flags:
                lines.append(wanted)
                flags = wanted
            lines.append(_gtkw_name(name))
        lines += ["@1000200", f"-{title}"]
    path.write_text("\n".join(lines) + "\n")
    return path
