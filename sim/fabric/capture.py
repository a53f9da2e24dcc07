"""Capture files of the fabric: pcapng with one interface per plane, and classic pcap.

pcapng (written here with :mod:`struct`, no extra dependency): one Interface Description
Block per plane, named ``plane0``, ``plane1``, ... (link type Ethernet, timestamps in ns),
then one Enhanced Packet Block per captured frame, sorted by capture time (arrival for a
delivered frame, hand-over for a dropped one). Each EPB carries

- the interface id = the plane, so Wireshark's ``frame.interface_id`` / ``frame.interface_name``
  show which plane the frame crossed;
- ``epb_flags`` direction: outbound for frames from the first endpoint (a -> b), inbound
  for the other direction (``frame.p2p_dir`` / ``pkt_comment`` in Wireshark);
- an ``opt_comment`` such as
  ``a->b plane=1 path=3 fate=delivered,ecn-marked sent_us=0.100000 arrival_us=1.200000``
  (times in us, as in every output file, to the ps). A dropped frame is there too, marked
  by its fate: ``fate=dropped-failure``, ``dropped-loss`` or ``dropped-queue``.

The classic pcap has no comments, so it holds only the delivered frames: what the receivers
saw.
"""

import struct

__all__ = ["write_pcapng", "write_pcap", "LINKTYPE_ETHERNET"]

LINKTYPE_ETHERNET = 1
_SHB = 0x0A0D0D0A
_IDB = 0x00000001
_EPB = 0x00000006
_BYTE_ORDER_MAGIC = 0x1A2B3C4D
_OPT_END = 0
_OPT_COMMENT = 1
_SHB_USERAPPL = 4
_IF_NAME = 2
_IF_DESCRIPTION = 3
_IF_TSRESOL = 9
_EPB_FLAGS = 2
_TSRESOL_NS = 9                 # 10^-9 s
_INBOUND, _OUTBOUND = 1, 2
_PCAP_NS_MAGIC = 0xA1B23C4D     # classic pcap with nanosecond timestamps


def _pad(data):
    return data + b"\0" * (-len(data) % 4)


def _option(code, value):
    return struct.pack("<HH", code, len(value)) + _pad(value)


def _options(*options):
    return b"".join(options) + struct.pack("<HH", _OPT_END, 0)


def _block(block_type, body):
    length = 12 + len(body)
    return struct.pack("<II", block_type, length) + body + struct.pack("<I", length)


def _comment(record):
    text = (f"{record.src}->{record.dst} plane={record.plane} path={record.path} "
            f"fate={record.fate} sent_us={record.sent_ns / 1000:.6f}")
    if record.arrival_ns is not None:
        text += f" arrival_us={record.arrival_ns / 1000:.6f}"
    if record.sent_len != len(record.frame):
        text += f" sent_len={record.sent_len}"
    return text


def write_pcapng(path, records, *, planes, endpoints=("a", "b")):
    """Write ``records`` (:class:`sim.fabric.fabric.Record`) as pcapng, one interface per
    plane."""
    out = [_block(_SHB, struct.pack("<IHHq", _BYTE_ORDER_MAGIC, 1, 0, -1)
                  + _options(_option(_SHB_USERAPPL, b"mrc-nic sim.fabric")))]
    for plane in range(planes):
        out.append(_block(_IDB, struct.pack("<HHI", LINKTYPE_ETHERNET, 0, 0) + _options(
            _option(_IF_NAME, f"plane{plane}".encode()),
            _option(_IF_DESCRIPTION, f"fabric plane {plane} (NIC port {plane})".encode()),
            _option(_IF_TSRESOL, bytes((_TSRESOL_NS,))))))
    for record in sorted(records, key=lambda r: r.time_ns):
        ts = round(record.time_ns)
        direction = _OUTBOUND if record.src == endpoints[0] else _INBOUND
        frame = record.frame
        out.append(_block(_EPB, struct.pack("<IIIII", record.plane, ts >> 32, ts & 0xFFFFFFFF,
                                            len(frame), len(frame)) + _pad(frame) + _options(
            _option(_OPT_COMMENT, _comment(record).encode()),
            _option(_EPB_FLAGS, struct.pack("<I", direction)))))
    with open(path, "wb") as f:
        f.write(b"".join(out))


def write_pcap(path, records):
    """Write the delivered frames, in arrival order, as a classic Ethernet pcap (ns
    timestamps, magic 0xa1b23c4d; no plane: use the pcapng for that)."""
    delivered = sorted((r for r in records if r.outcome == "delivered"),
                       key=lambda r: r.arrival_ns)
    out = [struct.pack("<IHHiIII", _PCAP_NS_MAGIC, 2, 4, 0, 0, 0xFFFF, LINKTYPE_ETHERNET)]
    for record in delivered:
        ts = round(record.arrival_ns)
        seconds, nanoseconds = divmod(ts, 1_000_000_000)
        frame = record.frame
        out.append(struct.pack("<IIII", seconds, nanoseconds, len(frame), len(frame)) + frame)
    with open(path, "wb") as f:
        f.write(b"".join(out))


def read_pcapng(path):
    """The records of a pcapng :func:`write_pcapng` wrote, rebuilt from the packets and their
    comments (:class:`sim.fabric.fabric.Record`; times in ns, to the ps): what a process that
    did not run the fabric (the RTL bench's parent) needs for the plots."""
    from .fabric import Record
    with open(path, "rb") as f:
        data = f.read()
    records = []
    offset = 0
    while offset + 12 <= len(data):
        block_type, length = struct.unpack_from("<II", data, offset)
        if block_type == _EPB:
            caplen = struct.unpack_from("<I", data, offset + 20)[0]
            frame = data[offset + 28:offset + 28 + caplen]
            position = offset + 28 + caplen + (-caplen % 4)
            fields = {}
            while position < offset + length - 4:
                code, size = struct.unpack_from("<HH", data, position)
                if code == _OPT_END:
                    break
                if code == _OPT_COMMENT:
                    text = data[position + 4:position + 4 + size].decode()
                    head, _, rest = text.partition(" ")
                    fields = dict(item.split("=", 1) for item in rest.split())
                    fields["src"], fields["dst"] = head.split("->")
                position += 4 + size + (-size % 4)
            if fields:
                outcome, *marks = fields["fate"].split(",")
                arrival = fields.get("arrival_us")
                records.append(Record(
                    float(fields["sent_us"]) * 1000,
                    None if arrival is None else float(arrival) * 1000,
                    fields["src"], fields["dst"], int(fields["plane"]), int(fields["path"]),
                    outcome, tuple(marks), frame, int(fields.get("sent_len", len(frame)))))
        offset += length
    return records
