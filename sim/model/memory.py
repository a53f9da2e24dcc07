"""A sparse byte-addressed host memory: what the responder writes into, what a test reads back."""

__all__ = ["Memory"]


class Memory:
    """Sparse bytes over a 64-bit address space. Unwritten bytes read as ``fill``."""

    def __init__(self, *, fill=0):
        self._bytes = {}
        self.fill = fill

    def write(self, addr, data):
        for offset, value in enumerate(bytes(data)):
            self._bytes[(addr + offset) % (1 << 64)] = value

    def read(self, addr, length):
        return bytes(self._bytes.get((addr + i) % (1 << 64), self.fill) for i in range(length))

    def write_place_beat(self, addr, data, keep, lanes):
        """Apply one placement beat (:func:`hdl.interfaces.place_beat_layout`): lane i -> addr+i."""
        for lane in range(lanes):
            if keep >> lane & 1:
                self._bytes[(addr + lane) % (1 << 64)] = (data >> (8 * lane)) & 0xFF

    @property
    def written(self):
        """``{address: byte}`` of every byte ever written."""
        return dict(self._bytes)

    def __len__(self):
        return len(self._bytes)

    def __eq__(self, other):
        return isinstance(other, Memory) and self._bytes == other._bytes
