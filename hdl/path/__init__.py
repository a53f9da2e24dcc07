"""Path layer: EV profiles and their reference expansion; later the EV tables and selection."""
