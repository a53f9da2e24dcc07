"""How the ``mrc-nic`` command reports a user error, in one place.

Every error a user can cause comes out as one line on standard error,
``mrc-nic <command>: <flag or field>: <what is wrong>``, with exit status 2 and no traceback.
Handlers return ``fail(...)``; argparse's own usage errors go through :class:`CliParser`, the
parser class of every ``mrc-nic`` parser and subparser, so they read the same way.
"""

import argparse
import json
import re
import sys

__all__ = ["fail", "UsageError", "CliParser", "nic_config_from", "PROG"]

PROG = "mrc-nic"

#: The subcommand being run ("sim", "ev expand", "boards bitstream"), set while parsing: the
#: innermost parser that parses last names it.
_command = ""


def set_command(command):
    global _command
    _command = command


def fail(message, *, field=None, status=2):
    """Print ``mrc-nic <command>: [<field>: ]<message>`` on stderr; return ``status``.

    ``field`` is the flag the user gave (``--planes``), the positional argument, or the file
    and field that set the value (``run.toml: planes``)."""
    text = f"{field}: {message}" if field else str(message)
    # One line, so scripts can show it as is: newlines inside a message would split it.
    text = " ".join(text.split())
    print(f"{PROG}{' ' + _command if _command else ''}: {text}", file=sys.stderr)
    return status


class UsageError(Exception):
    """A user error a handler raises instead of returning ``fail(...)``: ``field`` names the
    flag or field, ``message`` what is wrong. :func:`sim.cli.main` prints it with
    :func:`fail`."""

    def __init__(self, field, message):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


class HelpFormatter(argparse.HelpFormatter):
    """Shows every argument's default in ``--help`` (unless the help text already does, or
    the argument is a switch or has no default)."""

    def _get_help_string(self, action):
        text = action.help or ""
        # By identity: a default of 0 is shown, a switch's False is not.
        if ("default" in text or any(action.default is v for v in (None, False, argparse.SUPPRESS))
                or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


# argparse's messages, turned into "<flag>: <what is wrong>".
_ARGUMENT = re.compile(r"^argument (?P<name>[^:]+): (?P<rest>.*)$", re.S)
_REQUIRED = re.compile(r"^the following arguments are required: (?P<names>.*)$", re.S)
_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (?P<args>.*)$", re.S)


_INVALID = re.compile(r"^invalid (?P<kind>int|float) value: (?P<value>.*)$", re.S)
_KINDS = {"int": "an integer", "float": "a number"}


def _one_line(message):
    match = _ARGUMENT.match(message)
    if match:
        # An argument with aliases is named "--sim/--sims": name the first (canonical) one.
        name, rest = match["name"].split("/")[0], match["rest"]
        invalid = _INVALID.match(rest)
        if invalid:
            rest = f"must be {_KINDS[invalid['kind']]}, not {invalid['value']}"
        return name, rest
    match = _REQUIRED.match(message)
    if match:
        names = match["names"]
        return names, "required" if "," not in names else "are required"
    match = _UNRECOGNIZED.match(message)
    if match:
        first = match["args"].split()[0]
        return first, "not an option of this command (see --help)"
    return None, message


class CliParser(argparse.ArgumentParser):
    """The parser class of every ``mrc-nic`` parser: one-line usage errors with status 2, no
    usage dump; defaults in ``--help``; no abbreviated flags (an error names what was typed).
    Subparsers made with ``add_parser`` are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        set_command(self.prog.removeprefix(PROG).strip())
        return super().parse_known_args(args, namespace)

    def error(self, message):
        field, text = _one_line(message)
        self.exit(fail(text, field=field))

    def exit(self, status=0, message=None):
        if message:
            fail(message)
        sys.exit(status)


def nic_config_from(path, *, flag="--config"):
    """The :class:`hdl.config.NicConfig` of a JSON file (the defaults when ``path`` is None).
    Raises :class:`UsageError` naming the flag, the file and the field."""
    from hdl.config import ConfigError, NicConfig
    if path is None:
        return NicConfig()
    try:
        with open(path) as f:
            values = json.load(f)
    except OSError as e:
        raise UsageError(flag, f"{path}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise UsageError(flag, f"{path}: not valid JSON: {e}") from None
    try:
        return NicConfig.from_dict(values)
    except ConfigError as e:
        what = str(e).removeprefix(f"NicConfig.{e.field} ")
        if e.field == "<file>":
            raise UsageError(flag, f"{path}: {what}") from None
        raise UsageError(flag, f"{path}: {e.field}: {what}") from None
