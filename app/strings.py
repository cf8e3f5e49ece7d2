"""The flag strings, both ways: ``--backend``, ``--params-backend`` and ``--max-vram`` fields
plus the full sd-cli command, always in sync with the board.

Typing checks the strings on every keystroke (:meth:`PlanController.check_strings`: an
error underlines the exact span in its field, an input-method text format, so the field
keeps its text and cursor, with the message below; a valid edit says whether it would fit)
without touching the plan; Enter or leaving the field applies the edit as one undo step
(:meth:`PlanController.set_strings`), Escape puts the fields back to the plan. Plan
warnings about the flags show under the fields. The panel folds to one line
(:meth:`StringsPanel.set_collapsed`) so the board can take the space.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QCoreApplication, QEvent, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QInputMethodEvent,
    QKeyEvent,
    QKeySequence,
    QTextCharFormat,
)
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from sdplan.app import theme
from sdplan.app.controller import PlanController
from sdplan.app.warnings import flag_warnings
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
    """A flag value editor that underlines an error span (wavy red); Escape emits
    ``escaped`` (the panel restores the plan's value). Undo and Redo (Ctrl+Z, Ctrl+Shift+Z,
    Ctrl+Y) go to the plan's undo stack once the value is applied (it equals
    :attr:`applied` ``()``); while an edit is typed they undo the typing."""

    escaped = Signal()
    #: The plan's value of this flag now (set by the panel); None: the field keeps its own undo.
    applied: Callable[[], str] | None = None

    def _plan_shortcut(self, e: QEvent) -> bool:
        """Whether ``e`` is an Undo/Redo key the plan's stack takes (the value is applied)."""
        if self.applied is None or not isinstance(e, QKeyEvent) or self.text() != self.applied():
            return False
        return (e.matches(QKeySequence.StandardKey.Undo) or e.matches(QKeySequence.StandardKey.Redo)
                or (e.key() == Qt.Key.Key_Y and e.modifiers() == Qt.KeyboardModifier.ControlModifier))

    def event(self, e: QEvent) -> bool:  # noqa: D102 - Qt's name
        if e.type() == QEvent.Type.ShortcutOverride and self._plan_shortcut(e):
            e.ignore()  # not the field's: the window's Undo/Redo shortcut runs
            return False
        return super().event(e)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        if event.key() == Qt.Key.Key_Escape:
            self.escaped.emit()
            event.accept()
            return
        super().keyPressEvent(event)

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
    collapsedChanged = Signal(bool)
    pasteRequested = Signal()
    exportRequested = Signal()
    importRequested = Signal()

    def __init__(self, controller: PlanController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctl = controller
        self.setObjectName("Panel")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(14, 10, 14, 10)
        outer.setSpacing(6)
        top = QHBoxLayout()
        self.toggle = QToolButton()
        self.toggle.setAutoRaise(True)
        self.toggle.setCheckable(True)
        self.toggle.setToolTip("Fold the flags and the sd-cli command to one line")
        self.toggle.toggled.connect(lambda on: self.set_collapsed(not on))
        top.addWidget(self.toggle)
        title = QLabel("FLAGS")
        title.setObjectName("Section")
        top.addWidget(title)
        self.summary = QLabel()
        self.summary.setObjectName("Caption")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        top.addWidget(self.summary, 1)
        outer.addLayout(top)
        self.body = QWidget()
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(8)
        outer.addWidget(self.body)
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
            f.editingFinished.connect(self.apply)
            f.escaped.connect(self.revert)
            f.applied = lambda i=row: self._plan_texts()[i]
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
        self.hint = QLabel()
        self.hint.setObjectName("Caption")
        self.hint.setWordWrap(True)
        self.hint.hide()
        lay.addWidget(self.hint)
        self.warnings = QLabel()
        self.warnings.setObjectName("Warning")
        self.warnings.setWordWrap(True)
        self.warnings.hide()
        lay.addWidget(self.warnings)
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
        controller.modelChanged.connect(self._model_changed)
        self.toggle.setChecked(True)
        self.refresh("load")

    # ------------------------------------------------------------------ folding
    def set_collapsed(self, collapsed: bool) -> None:
        """Fold to one line (the title and the flags as a summary) or unfold."""
        self.body.setVisible(not collapsed)
        self.summary.setVisible(collapsed)
        # folded, the panel is one line high and the splitter gives the rest to the board
        self.setMaximumHeight(self.minimumSizeHint().height() if collapsed else 16777215)
        if self.toggle.isChecked() == collapsed:
            self.toggle.setChecked(not collapsed)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow if collapsed else Qt.ArrowType.DownArrow)
        self.collapsedChanged.emit(collapsed)

    def is_collapsed(self) -> bool:
        return not self.body.isVisibleTo(self)

    # ------------------------------------------------------------------ editing
    def texts(self) -> tuple[str, str, str]:
        f = self.fields
        return f["--backend"].text(), f["--params-backend"].text(), f["--max-vram"].text()

    def _plan_texts(self) -> tuple[str, str, str]:
        plan = self.ctl.plan
        return plan.backend, plan.params_backend, plan.max_vram

    def typed_hints(self) -> list[str]:
        """What the typed ``--backend`` value probably meant otherwise
        (``diffusion=CUDA0,CUDA1``: did you mean ``diffusion=CUDA0&CUDA1``?)."""
        return self.ctl.session.string_hints(self.texts()[0])

    def _edited(self, _: str) -> None:
        """Check the typed strings (the plan stays as it is until Enter)."""
        fit = self.ctl.check_strings(*self.texts())
        if self.ctl.error is not None:
            self.hint.hide()
            return
        verdict = ""
        if fit is not None:
            verdict = " — it fits" if fit.fits else f" — it would not fit ({fit.reasons[0]})"
        hints = "".join(f"\n→ {h}" for h in self.typed_hints())
        self.hint.setText(f"↵ Enter applies this edit{verdict} · Esc puts the plan back{hints}")
        self.hint.show()

    def apply(self) -> bool:
        """Apply the typed strings (Enter, or leaving a field); True when they resolved.
        Unchanged strings do nothing."""
        self.hint.hide()
        if self.texts() == self._plan_texts() and self.ctl.error is None:
            return True
        return self.ctl.set_strings(*self.texts())

    def revert(self) -> None:
        """Escape: the fields show the plan again and the error goes."""
        self.hint.hide()
        self.ctl.clear_string_error()
        self.refresh("load")

    def _model_changed(self) -> None:
        self.refresh("load")

    def refresh(self, source: str = "board") -> None:
        """Rewrite the fields (unless the user is typing in them), the summary, the flag
        warnings and the command."""
        plan = self.ctl.plan
        if source != "strings":
            for flag, value in zip(self.fields, self._plan_texts(), strict=True):
                if self.fields[flag].text() != value:
                    self.fields[flag].setText(value)
        parts = [f"{flag} {value}" for flag, value in zip(self.fields, self._plan_texts(), strict=True)
                 if value]
        self.summary.setText("  ".join(parts) or "default placement (no flags)")
        warns = [w.message for w in flag_warnings(plan, self.ctl.inventory)]
        warns += self.typed_hints()  # what the value as typed probably meant otherwise
        self.warnings.setText("\n".join("⚠ " + w for w in warns))
        self.warnings.setVisible(bool(warns))
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
        self.error.setText(f"✕  {err}  [{err.code}] — the board keeps the plan (Esc puts "
                           "the fields back)")
        self.error.show()
