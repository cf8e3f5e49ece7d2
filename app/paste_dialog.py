"""The paste dialog: an sd-cli command (the clipboard's, editable, wrapped in full) and what
it will bring before it applies: each model file found here or not, where the sizes come
from, the placement strings, the settings a run will use (the command's over sd-cli's
defaults for that model), the arguments kept verbatim and those sd-cli would refuse
(:meth:`sdplan.core.session.session.Session.preview_command`)."""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFontDatabase, QTextOption
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)
from sdplan.core.session.paste import CommandPreview
from sdplan.core.session.session import Session

#: Settings the preview names (sd-cli's request keys -> its flags), in this order.
SHOWN = (("prompt", "-p"), ("width", "-W"), ("height", "-H"), ("steps", "--steps"),
         ("cfg_scale", "--cfg-scale"), ("sampling_method", "--sampling-method"),
         ("scheduler", "--scheduler"), ("seed", "-s"), ("guidance", "--guidance"))


def describe_preview(preview: CommandPreview) -> str:
    """The preview as rich text (files found or missing, sizes, placement, settings, kept
    and refused arguments)."""
    if preview.error:
        return f"<b>✕ Cannot import:</b> {html.escape(preview.error)}"
    lines = []
    for key, path, here in preview.files:
        mark = "✓ found" if here else "✕ not on this machine"
        lines.append(f"--{key.replace('_', '-')} <code>{html.escape(Path(path).name)}</code> "
                     f"— {mark}")
    if not preview.files:
        lines.append("No model files: the open model stays")
    lines.append(f"Sizes from {html.escape(preview.sizes)}" if not preview.sizes.startswith(
        "unknown") else f"Sizes {html.escape(preview.sizes)}: the board shows the placement "
        "without sizes")
    flags = [f"--{k.replace('_', '-')} {html.escape(v)}" for k, v in preview.placement.items() if v]
    lines.append("Placement: " + ("  ".join(flags) if flags else "the default"))
    given = set(preview.given)
    parts = []
    for key, flag in SHOWN:
        if key in preview.settings and preview.settings[key] not in (None, ""):
            value = html.escape(str(preview.settings[key]))
            parts.append(f"{flag} {value}" + ("" if key in given else " <i>(default)</i>"))
    lines.append("Settings: " + ", ".join(parts))
    if preview.kept:
        lines.append("Kept as written: <code>" + html.escape(" ".join(preview.kept)) + "</code>")
    if preview.unknown:
        lines.append("Not sd-cli options (kept, sd-cli would refuse them): <code>"
                     + html.escape(" ".join(preview.unknown)) + "</code>")
    return "<br>".join(lines)


class PasteDialog(QDialog):
    """See module docstring. ``text()`` is the command to import once accepted."""

    def __init__(self, session: Session, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.setWindowTitle("Paste sd-cli command")
        self.setMinimumWidth(560)
        if parent is not None:
            self.resize(max(560, min(860, int(parent.width() * 0.7))), 420)
        lay = QVBoxLayout(self)
        head = QLabel("The command (edit it here); what it brings is shown below and applies "
                      "only with Import. Undo takes the whole import back.")
        head.setWordWrap(True)
        lay.addWidget(head)
        self.editor = QPlainTextEdit(text)
        self.editor.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.editor.setWordWrapMode(QTextOption.WrapMode.WrapAnywhere)
        self.editor.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.editor.setPlaceholderText("sd-cli -m model.safetensors -p \"a prompt\" --backend CUDA0")
        lay.addWidget(self.editor, 1)
        self.preview_label = QLabel()
        self.preview_label.setWordWrap(True)
        self.preview_label.setTextFormat(Qt.TextFormat.RichText)
        self.preview_label.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.preview_label)
        lay.addWidget(scroll, 1)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.import_btn = self.buttons.addButton("Import",
                                                 QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self.preview: CommandPreview = CommandPreview()
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(250)
        self._timer.timeout.connect(self.refresh)
        self.editor.textChanged.connect(self._timer.start)
        self.refresh()

    def text(self) -> str:
        """The command as it stands in the editor."""
        return self.editor.toPlainText()

    def refresh(self) -> None:
        """Preview the command in the editor (Import only for one that can be imported)."""
        text = self.text()
        if not text.strip():
            self.preview = CommandPreview(error="the clipboard holds no command: paste one here")
        else:
            self.preview = self.session.preview_command(text)
        self.preview_label.setText(describe_preview(self.preview))
        self.import_btn.setEnabled(self.preview.error is None)
