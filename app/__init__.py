"""sdplan.app: the PySide6 desktop application over :mod:`sdplan.core`."""
