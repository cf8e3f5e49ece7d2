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


class ElidedLabel(QLabel):
    """A one-line label that shows as much of its text as its width allows, the middle
    elided (a long folder path keeps its start and its end); the tooltip has it all."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.full = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        self.full = text
        self.setToolTip(text)
        self._elide()

    def _elide(self) -> None:
        from PySide6.QtCore import Qt

        shown = self.fontMetrics().elidedText(self.full, Qt.TextElideMode.ElideMiddle,
                                              max(self.width(), 40))
        super().setText(shown)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()
