"""The flag strings, both ways: ``--backend``, ``--params-backend`` and ``--max-vram`` fields
plus the full sd-cli command, always in sync with the board.

Typing re-plans on every keystroke (:meth:`PlanController.set_strings`); an error
underlines the exact span in its field (an input-method text format, so the field keeps
its text and cursor) with the message below, and the board stays as it was.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontDatabase, QInputMethodEvent, QTextCharFormat
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)
from sdplan.app import theme
from sdplan.app.controller import PlanController
from sdplan.core.errors import PlanError

BACKEND_HELP = (
    "<b>--backend</b> where modules run.<br>"
    "<code>CUDA0</code> default for every module · <code>te=CPU</code> one module · "
    "<code>diffusion=CUDA0&amp;CUDA1</code> layer split (first = main device).<br>"
    "Modules: diffusion, te, clip_vision, vae, controlnet, photomaker, upscaler, detector. "
    "Devices: exact names, a registry (<code>cuda</code>, <code>vulkan</code>, "
    "<code>rpc</code>), <code>gpu</code>, <code>auto</code> or a unique prefix. "
    "Later entries win; a module entry beats the default.")
PARAMS_HELP = (
    "<b>--params-backend</b> where weights live between uses.<br>"
    "<code>CPU</code> keep every module's weights in RAM · <code>diffusion=disk</code> read "
    "from the file each run · <code>te=CUDA1</code> keep them on another device. "
    "Without an entry weights follow the runtime device. No <code>&amp;</code> lists here.")
VRAM_HELP = (
    "<b>--max-vram</b> memory budgets in GiB (plain numbers).<br>"
    "<code>10</code> every GPU · <code>CUDA0=8,CUDA1=6</code> per device · "
    "<code>-2</code> keep 2 GiB free · <code>0</code> no budget. Single-device modules "
    "then run in segments that fit.")


class FlagField(QLineEdit):
    """A flag value editor that underlines an error span (wavy red)."""

    def __init__(self, flag: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.flag = flag
        self.error_span: tuple[int, int] | None = None
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.setClearButtonEnabled(True)

    def set_error(self, span: tuple[int, int] | None) -> None:
        """Underline ``span`` (half-open character offsets), or clear with None. A flag-level
        error without a span underlines the whole value."""
        self.error_span = span
        self.setProperty("error", span is not None)
        self.style().unpolish(self)
        self.style().polish(self)
        attrs = []
        if span is not None:
            start, end = span
            if end <= start:
                start, end = max(start - 1, 0), max(start, 1)
            fmt = QTextCharFormat()
            fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
            fmt.setUnderlineColor(QColor(theme.DANGER))
            fmt.setForeground(QColor(theme.DANGER))
            attrs.append(QInputMethodEvent.Attribute(
                QInputMethodEvent.AttributeType.TextFormat, start - self.cursorPosition(),
                end - start, fmt))
        QCoreApplication.sendEvent(self, QInputMethodEvent("", attrs))


class StringsPanel(QFrame):
    """Three flag fields, the error line, and the sd-cli command with its buttons."""

    copyRequested = Signal()
    pasteRequested = Signal()
    exportRequested = Signal()
    importRequested = Signal()

    def __init__(self, controller: PlanController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctl = controller
        self.setObjectName("Panel")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(14, 12, 14, 12)
        lay.setSpacing(8)
        title = QLabel("FLAGS")
        title.setObjectName("Section")
        lay.addWidget(title)
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(6)
        self.fields: dict[str, FlagField] = {}
        for row, (flag, tip) in enumerate((("--backend", BACKEND_HELP),
                                           ("--params-backend", PARAMS_HELP),
                                           ("--max-vram", VRAM_HELP))):
            lab = QLabel(flag)
            lab.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
            lab.setToolTip(tip)
            grid.addWidget(lab, row, 0)
            f = FlagField(flag)
            f.setToolTip(tip)
            f.setPlaceholderText({"--backend": "default device (auto)",
                                  "--params-backend": "weights follow the runtime device",
                                  "--max-vram": "no budget"}[flag])
            f.textEdited.connect(self._edited)
            grid.addWidget(f, row, 1)
            lab.setBuddy(f)
            self.fields[flag] = f
        lay.addLayout(grid)
        self.error = QLabel()
        self.error.setObjectName("Error")
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.hide()
        lay.addWidget(self.error)
        cmd_head = QHBoxLayout()
        ct = QLabel("SD-CLI COMMAND")
        ct.setObjectName("Section")
        cmd_head.addWidget(ct)
        cmd_head.addStretch(1)
        self.buttons: dict[str, QPushButton] = {}
        for key, text, tip, sig in (
                ("copy", "Copy", "Copy the sd-cli command (Ctrl+Shift+C)", self.copyRequested),
                ("paste", "Paste command…", "Import model paths, placement and generation "
                 "settings from an sd-cli command on the clipboard (Ctrl+Shift+V)",
                 self.pasteRequested),
                ("export", "Export plan…", "Save the plan as JSON", self.exportRequested),
                ("import", "Import plan…", "Load a plan saved as JSON", self.importRequested)):
            b = QPushButton(text)
            b.setToolTip(tip)
            b.clicked.connect(sig.emit)
            cmd_head.addWidget(b)
            self.buttons[key] = b
        lay.addLayout(cmd_head)
        self.command = QPlainTextEdit()
        self.command.setReadOnly(True)
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        mono.setStyleHint(QFont.StyleHint.Monospace)
        self.command.setFont(mono)
        self.command.setMaximumHeight(self.fontMetrics().lineSpacing() * 4 + 14)
        self.command.setToolTip("The exact sd-cli command for this plan (always in sync)")
        lay.addWidget(self.command)
        controller.planChanged.connect(self.refresh)
        controller.errorChanged.connect(self.show_error)
        controller.modelChanged.connect(lambda: self.refresh("load"))
        self.refresh("load")

    def _edited(self, _: str) -> None:
        f = self.fields
        self.ctl.set_strings(f["--backend"].text(), f["--params-backend"].text(),
                             f["--max-vram"].text())

    def refresh(self, source: str = "board") -> None:
        """Rewrite the fields (unless the user is typing in them) and the command."""
        plan = self.ctl.plan
        if source != "strings":
            for flag, value in (("--backend", plan.backend),
                                ("--params-backend", plan.params_backend),
                                ("--max-vram", plan.max_vram)):
                if self.fields[flag].text() != value:
                    self.fields[flag].setText(value)
        self.command.setPlainText(self.ctl.command_line())

    def show_error(self, err: PlanError | None) -> None:
        """Underline the span of ``err`` in its field and show the message (None clears)."""
        for f in self.fields.values():
            f.set_error(None)
        if err is None:
            self.error.hide()
            return
        field = self.fields.get(err.flag or "")
        if field is not None:
            span = err.span if err.span is not None else (0, len(field.text()))
            field.set_error(span)
        self.error.setText(f"✕  {err}  [{err.code}] — the board keeps the last valid plan")
        self.error.show()
