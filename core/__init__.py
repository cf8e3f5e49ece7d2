"""sdplan.core: pure-Python planning, model files and pipelines (no Qt).

Importable without Qt and without the native extension.
"""

__version__ = "0.1.0"
