"""The NIC's control plane: one register map over every block's plain control ports."""
