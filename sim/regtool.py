"""``mrc-nic registers``: the NIC's register map (``hdl/control/nicmap.py``) as Markdown (the
text of ``docs/registers.md``), JSON, a C header or CMSIS-SVD, all from the one description.

Errors a user can cause (an unknown ``--format``, a missing or malformed ``--config``, an
``--out`` that cannot be written) print one line, ``mrc-nic registers: <flag>: <what is
wrong>``, and exit with status 2.
"""

import sys
from pathlib import Path

from .errors import fail, nic_config_from

__all__ = ["register", "FORMATS", "render"]

#: ``--format`` values and what each writes.
FORMATS = {
    "md": "Markdown, as docs/registers.md",
    "json": "JSON: to_dict() with a format name and version (keys: hdl/control/export.py)",
    "c": "C11 header: byte addresses, field shift/width/mask/reset macros, accessors",
    "svd": "CMSIS-SVD 1.3 (one peripheral per block)",
}


def render(regmap, fmt):
    """The text of ``regmap`` in ``fmt`` (a key of :data:`FORMATS`)."""
    from hdl.control.export import to_c_header, to_json, to_svd
    writers = {"md": lambda: regmap.markdown(), "json": lambda: to_json(regmap),
               "c": lambda: to_c_header(regmap), "svd": lambda: to_svd(regmap)}
    if fmt not in writers:
        raise ValueError(f"format must be one of {sorted(writers)}, not {fmt!r}")
    return writers[fmt]()


def _registers(args):
    from hdl.control.nicmap import nic_register_map
    if args.format not in FORMATS:
        return fail(f"must be one of {', '.join(FORMATS)}, not {args.format!r}",
                    field="--format")
    config = nic_config_from(args.config)        # a bad file: UsageError, one line
    text = render(nic_register_map(config), args.format)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.write_text(text)
    except OSError as e:
        return fail(f"{args.out}: cannot write: {e.strerror}", field="--out")
    print(f"wrote {args.out}")
    return 0


def register(subparsers):
    """Add ``registers`` to ``mrc-nic``'s subcommands."""
    p = subparsers.add_parser(
        "registers", help="the NIC's register map as Markdown, JSON, a C header or SVD",
        description="Write the NIC's register map (hdl/control/nicmap.py) in one format: "
                    + "; ".join(f"{name}: {what}" for name, what in FORMATS.items()) + ".")
    p.add_argument("--format", default="md", metavar="|".join(FORMATS),
                   help="output format (default: md)")
    p.add_argument("--config", type=Path, metavar="CONFIG.json",
                   help="NicConfig JSON (docs/configuration.md; default: the defaults)")
    p.add_argument("--out", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=_registers)
