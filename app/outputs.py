"""Where the app saves pictures: an output folder the user sees and can change (File →
Output folder…, or the Generate panel's "Change…"), by default ``sdplan`` in the platform's
pictures folder (``~/Pictures/sdplan``; Qt's ``PicturesLocation``), never the settings
folder. Pictures of an older sdplan (``sdplan-history`` beside the settings) stay in the
gallery. The command line's ``-o`` is unchanged."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, QStandardPaths

#: The settings key of the output folder.
SETTING = "output/folder"


def default_output_folder() -> Path:
    """``sdplan`` in the platform's pictures folder (the home folder's ``Pictures`` where the
    platform names none)."""
    pictures = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.PicturesLocation)
    return Path(pictures or Path.home() / "Pictures") / "sdplan"


def output_folder(settings: QSettings) -> Path:
    """The folder the user chose (``output/folder``), else :func:`default_output_folder`."""
    chosen = settings.value(SETTING)
    return Path(str(chosen)) if chosen else default_output_folder()


def older_results(settings: QSettings) -> Path | None:
    """The results folder of an older sdplan (``sdplan-history`` beside the settings file)
    when it exists, for the gallery; else None."""
    old = Path(settings.fileName()).parent / "sdplan-history"
    return old if old.is_dir() else None
