"""Dialogs: the Auto plan diff to accept, the About box, the string-syntax guide."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QMessageBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)
from sdplan.app import strings
from sdplan.core import __version__
from sdplan.core.planning.autoplan import AutoPlan
from sdplan.core.runtime.native import NativeUnavailable, native


class AutoPlanDialog(QDialog):
    """Shows what Auto plan would change (before/after per module and flag) to accept."""

    def __init__(self, proposal: AutoPlan, rows: list[tuple[str, str, str]],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Auto plan")
        self.proposal = proposal
        lay = QVBoxLayout(self)
        verdict = QLabel(("✓ The proposal fits." if proposal.fits else
                          "✕ Even the proposal does not fit these devices.")
                         + " Review the changes:")
        verdict.setObjectName("Verdict")
        verdict.setProperty("fits", proposal.fits)
        lay.addWidget(verdict)
        self.table = QTableWidget(len(rows), 3)
        self.table.setHorizontalHeaderLabels(["", "Now", "Proposed"])
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                self.table.setItem(r, c, QTableWidgetItem(text))
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().hide()
        lay.addWidget(self.table)
        notes = QLabel("\n".join("• " + n for n in proposal.notes))
        notes.setObjectName("Muted")
        notes.setWordWrap(True)
        lay.addWidget(notes)
        if not rows:
            lay.addWidget(QLabel("The current plan is already what Auto plan proposes."))
        box = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.accept_btn = box.addButton("Apply proposal", QDialogButtonBox.ButtonRole.AcceptRole)
        self.accept_btn.setEnabled(bool(rows))
        box.accepted.connect(self.accept)
        box.rejected.connect(self.reject)
        lay.addWidget(box)
        self.resize(760, 380)


def versions() -> dict[str, str]:
    """Versions shown in the About box: sdplan, ggml (when the native module loads), Qt."""
    from PySide6 import __version__ as pyside
    from PySide6.QtCore import qVersion

    out = {"sdplan": __version__}
    try:
        out["ggml"] = str(native().ggml_version())
    except (NativeUnavailable, AttributeError) as exc:
        out["ggml"] = f"not available ({exc})"
    out["Qt"] = qVersion()
    out["PySide6"] = pyside
    return out


def about(parent: QWidget) -> None:
    """The About box."""
    v = versions()
    rows = "".join(f"<tr><td><b>{k}</b>&nbsp;&nbsp;</td><td>{val}</td></tr>"
                   for k, val in v.items())
    QMessageBox.about(parent, "About sdplan",
                      "<h3>sdplan</h3><p>Plan and run stable-diffusion.cpp device placements "
                      f"on mixed hardware.</p><table>{rows}</table>")


def syntax_help(parent: QWidget) -> None:
    """The string-syntax guide (the same text as the fields' tooltips)."""
    QMessageBox.information(parent, "Placement strings", "<p>" + "</p><p>".join(
        (strings.BACKEND_HELP, strings.PARAMS_HELP, strings.VRAM_HELP)) + "</p>")
