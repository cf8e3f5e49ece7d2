"""Helpers of the ``sdplan generate`` tests: the command's arguments as its parser reads
them, and a written picture as integer RGB."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image


def parse(argv: list[str]) -> argparse.Namespace:
    """``sdplan generate ARGV`` parsed by the command's own parser (``args.run(args)`` runs it)."""
    from sdplan.core.commands import generate

    p = argparse.ArgumentParser()
    generate.add_parser(p.add_subparsers())
    return p.parse_args(["generate", *argv])


def png(path: Path) -> np.ndarray:
    """The picture at ``path`` as int RGB ``(H, W, 3)``."""
    return np.asarray(Image.open(path).convert("RGB")).astype(int)
