"""Board tops, the on-chip self-test and the bitstream/synthesis flow (docs/boards.md)."""
