"""Subcommands of the ``sdplan`` command line, one module each."""
