"""Packet layer: header layouts (one table), and later the parser, deparser and ICRC."""
