"""Simulation side of mrc-nic: packets, models, benches and the ``mrc-nic`` command."""

from .env import apply_defaults

apply_defaults()
