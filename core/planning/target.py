"""What a plan is for: sdplan's own engine, or sd-cli in one of its two dialects (spec
section 14).

sd-cli changed after the snapshot the spec's first sections and the golden cases were
recorded from (stable-diffusion.cpp 97d2990). The *snapshot* dialect has the bare
``--auto-fit`` switch of section 13, ``--stream-layers`` and ``--vae-tile-size`` in latent
pixels; the *newest* dialect takes ``--auto-fit on|off`` (on when absent), streams by itself
(``--disable-prefetch`` and ``--disable-segmented-compute`` are its switches; there is no
``--stream-layers``), takes ``--split-ratio`` and ``--backend cfg=DEVICE``, and reads
``--vae-tile-size`` in image pixels.

A user names the dialect (``--sdcli-dialect``) or gives the binary (``--sdcli PATH``), whose
``--help`` text tells (:func:`dialect_from_help`, the test third-party launchers of sd-cli
use); unknown means newest. :func:`dialect_of_args` tells the dialect a pasted command was
written for from its own syntax, when it shows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DIALECTS", "ENGINES", "Target", "dialect_from_help", "dialect_of_args",
           "NEWEST_ONLY_FLAGS", "SNAPSHOT_ONLY_FLAGS", "flag_in_dialect"]

#: sd-cli's dialects (spec section 14).
DIALECTS = ("snapshot", "newest")
#: What a plan can be for.
ENGINES = ("sdplan", "sd-cli")

#: Options only the newest sd-cli has (its ``docs/backend.md`` and ``docs/performance.md``
#: after 97d2990; spec sections 14.2, 14.4, 14.8).
NEWEST_ONLY_FLAGS = frozenset({"--disable-prefetch", "--disable-segmented-compute",
                               "--split-ratio", "--tokenizer"})
#: Options only the snapshot has (the newest sd-cli streams by itself; spec section 14.2).
SNAPSHOT_ONLY_FLAGS = frozenset({"--stream-layers"})


def flag_in_dialect(flag: str, dialect: str) -> bool:
    """Whether sd-cli in ``dialect`` has the option ``flag`` (its long spelling); options of
    neither list exist in both."""
    if dialect == "snapshot":
        return flag not in NEWEST_ONLY_FLAGS
    return flag not in SNAPSHOT_ONLY_FLAGS


@dataclass(frozen=True)
class Target:
    """What a plan is for.

    Attributes:
        engine: ``sdplan`` (its own engine) or ``sd-cli``.
        dialect: ``snapshot`` or ``newest``: the sd-cli the plan's flags mean (for the
            ``sdplan`` engine: the dialect its written sd-cli command is for).
        known: whether the dialect was named or read; False means newest was assumed.
        source: how the dialect was learnt, for people (``--sdcli-dialect``, ``--help of
            PATH``, ``the command's syntax``, ``assumed``).
    """

    engine: str = "sdplan"
    dialect: str = "newest"
    known: bool = False
    source: str = "assumed"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; one of {', '.join(ENGINES)}")
        if self.dialect not in DIALECTS:
            raise ValueError(f"unknown sd-cli dialect {self.dialect!r}; one of "
                             f"{', '.join(DIALECTS)}")

    @property
    def sdcli(self) -> bool:
        """True when the plan is for sd-cli (its ranges, its estimate, its auto-fit)."""
        return self.engine == "sd-cli"

    def label(self) -> str:
        """One line for people: ``sd-cli (newest, assumed)``, ``sdplan's engine``."""
        if not self.sdcli:
            return "sdplan's engine"
        return f"sd-cli ({self.dialect}, {self.source})"

    def to_json(self) -> dict[str, object]:
        return {"engine": self.engine, "dialect": self.dialect, "known": self.known,
                "source": self.source}


_AUTO_FIT_ON_OFF = re.compile(r"--auto-fit\b[^\n]*\bon\s*\|\s*off\b|--auto-fit\s+(?:\[|<)?on\|off",
                              re.IGNORECASE)


def dialect_from_help(text: str) -> str | None:
    """The dialect an sd-cli ``--help`` text shows (spec section 14): ``--auto-fit``
    described with ``on|off`` or a ``--disable-segmented-compute`` option means newest;
    ``--stream-layers`` without either means snapshot; None when the text shows neither
    (not sd-cli's help, or a build that has none of these options)."""
    if _AUTO_FIT_ON_OFF.search(text) or "--disable-segmented-compute" in text:
        return "newest"
    if "--stream-layers" in text:
        return "snapshot"
    return None


def dialect_of_args(args: Sequence[str]) -> str | None:
    """The dialect a pasted argument list shows by its own syntax, or None.

    Newest: ``--auto-fit on|off`` (or ``--auto-fit=on|off``), one of
    :data:`NEWEST_ONLY_FLAGS` or a ``cfg=`` entry in ``--backend`` (a ``WxH``
    ``--vae-tile-size`` is no sign: the snapshot takes it too, in latent pixels). Snapshot:
    the bare ``--auto-fit`` switch or ``--stream-layers``.
    A command showing both is read as newest (its newest options would not run on the
    snapshot).
    """
    newest = snapshot = False
    for i, arg in enumerate(args):
        flag, _, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        nxt = inline if inline else (args[i + 1] if i + 1 < len(args) else "")
        if flag == "--auto-fit":
            if nxt.strip().lower() in ("on", "off"):
                newest = True
            else:
                snapshot = True
        elif flag in NEWEST_ONLY_FLAGS:
            newest = True
        elif flag in SNAPSHOT_ONLY_FLAGS:
            snapshot = True
        elif flag == "--backend" and re.search(r"(?:^|,)\s*cfg\s*=", nxt, re.IGNORECASE):
            newest = True
    if newest:
        return "newest"
    return "snapshot" if snapshot else None
