"""A word-wrapped label whose minimum height follows its width.

Qt lays out a word-wrapped ``QLabel`` from a guessed width, so in a narrow column its text
can spill over the widgets below it. :class:`WrapLabel` sets its minimum height to the
height its text needs at its current width whenever it is resized or its text changes.
"""

from __future__ import annotations

from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class WrapLabel(QLabel):
    """See module docstring."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setWordWrap(True)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)

    def _fit(self) -> None:
        need = self.heightForWidth(max(self.width(), 1)) if self.text() else 0
        if need != self.minimumHeight():
            self.setMinimumHeight(need)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        super().setText(text)
        self._fit()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._fit()
