"""The ``--waves``, ``--waves-from`` and ``--waves-to`` flags, alike on every ``mrc-nic``
command that runs an RTL simulation (``sim``, ``replay``, ``flow``, ``bench``).

``--waves`` writes one FST file; ``--waves-from US`` / ``--waves-to US`` limit it to a window
of simulated time, in microseconds from the start of the simulation (the file's own time
axis), and imply ``--waves``. The window is given to the simulator at run time, so changing it
never rebuilds the simulator (:mod:`sim.tb.runner`). ``docs/sim.md``, "Waveforms".
"""

from pathlib import Path

from .errors import UsageError

__all__ = ["add_waves_arguments", "waves_from_args"]


def add_waves_arguments(parser, where):
    """Add the three flags to ``parser``; ``where`` says where the file goes (help text)."""
    parser.add_argument("--waves", action="store_true",
                        help=f"write FST waveforms to {where}, with a GTKWave view (.gtkw) "
                             f"beside each file (docs/sim.md, Waveforms)")
    parser.add_argument("--waves-from", dest="waves_from_us", type=float, default=None,
                        metavar="US", help="waves only from this simulated time on, us from "
                                           "the start of the simulation (implies --waves)")
    parser.add_argument("--waves-to", dest="waves_to_us", type=float, default=None,
                        metavar="US", help="waves only up to this simulated time, us "
                                           "(implies --waves)")


def waves_from_args(args, path):
    """The :class:`sim.tb.runner.WavesWindow` the flags ask for, writing ``path``; ``None``
    without any of them. Raises :class:`sim.errors.UsageError` naming the flag."""
    from .tb.runner import WavesWindow
    if not (args.waves or args.waves_from_us is not None or args.waves_to_us is not None):
        return None
    try:
        return WavesWindow(Path(path), args.waves_from_us, args.waves_to_us)
    except ValueError as e:
        flag, _, message = str(e).partition(": ")
        raise UsageError(flag, message) from None
