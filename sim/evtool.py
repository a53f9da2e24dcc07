"""The ``mrc-nic ev`` command: expand an EV profile document with the reference model.

``mrc-nic ev expand PROFILE.json [--json]`` prints each expanded EV (the 256-bit image of
:func:`hdl.path.ev.expand`) as 64 lowercase hex digits, one per line in the document's order,
or as one JSON list with ``--json``. A bad document prints one line naming the file and the
broken rule on standard error (``mrc-nic ev expand: PROFILE.json: profile.evs[2]: ...``) and exits
with status 2. The document format is in ``docs/ev-expansion.md``.
"""

import errno
import json
import sys
from pathlib import Path

from hdl.path.ev import EvProfileError, expand, load_profile_json

from .errors import fail

__all__ = ["register", "expand_command", "main"]


def register(subparsers):
    """Add the ``ev`` command (with its ``expand`` subcommand) to an argparse subparsers object.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers`` returned.

    Returns
    -------
    argparse.ArgumentParser
        The ``ev`` parser.
    """
    ev_parser = subparsers.add_parser(
        "ev", help="EV profiles: expand EVs with the reference model",
        description="EV profiles: expand EVs with the reference model (docs/ev-expansion.md).")
    ev_commands = ev_parser.add_subparsers(dest="ev_command", required=True, metavar="COMMAND")
    expand_parser = ev_commands.add_parser(
        "expand", help="print the expanded EV of every EV of a profile document",
        description="Print the 256-bit expanded image of each EV of a profile document, as 64 "
                    "hex digits per line, in the document's order. A generated profile with "
                    "\"count\" is generated first.")
    expand_parser.add_argument("profile", metavar="PROFILE.json", type=Path,
                               help="profile document (format, profile, evs or count)")
    expand_parser.add_argument("--json", action="store_true",
                               help="print one JSON list of hex strings instead")
    expand_parser.set_defaults(func=expand_command)
    return ev_parser



def expand_command(args):
    """Handler of ``mrc-nic ev expand``: returns the exit status (0, or 2 for bad input)."""
    path = args.profile
    try:
        raw = path.read_bytes()
    except OSError as error:
        code = errno.errorcode.get(error.errno, "EIO")
        return fail(f"cannot read: {error.strerror} ({code})", field=path)
    try:
        document = json.loads(raw)
    except ValueError as error:      # JSONDecodeError, or bytes that are not UTF-8/16/32
        return fail(f"not valid JSON: {error} (EINVAL)", field=path)
    try:
        spec = load_profile_json(document)
        # Expand everything before printing, so a bad EV leaves no partial output.
        images = [expand(spec.profile, ev, index=index).hex()
                  for index, ev in enumerate(spec.evs)]
    except EvProfileError as error:
        if error.field.startswith("evs["):
            error = error.within("profile")
        return fail(str(error), field=path)
    if args.json:
        print(json.dumps(images))
    else:
        for image in images:
            print(image)
    return 0


def main(argv=None):
    """``python -m sim.evtool ev expand ...``: the same as ``mrc-nic ev expand ...``."""
    from .cli import main as mrc_nic
    return mrc_nic(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
