"""Gateware of mrc-nic, and the protocol facts it shares with the simulation side."""
