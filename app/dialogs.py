"""Dialogs: the Auto plan diff to accept, the About box, the string-syntax guide."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)
from sdplan.app import strings
from sdplan.core import __version__
from sdplan.core.planning.autoplan_review import Alternative, AutoPlanReview
from sdplan.core.runtime.native import NativeUnavailable, native


class AutoPlanDialog(QDialog):
    """Shows what Auto plan would change (before/after per module and flag) to accept, the
    predicted time and the memory per device of the current plan and of the proposal, what
    limits it (a budget of the user's rather than the hardware), and the alternatives that
    fit when it does not (see :mod:`sdplan.core.planning.autoplan_review`).

    After ``exec()``: :attr:`choice` is the chosen alternative, or None for the proposal.
    """

    def __init__(self, review: AutoPlanReview, rows: list[tuple[str, str, str]],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Auto plan")
        self.review = review
        self.proposal = review.proposal
        self.choice: Alternative | None = None
        lay = QVBoxLayout(self)
        fits = review.fit.fits
        if review.worse:
            text = ("✕ The proposal would fit worse than your current plan"
                    + (", which fits" if review.current_fit.fits else "")
                    + ": your plan stays unless you choose otherwise.")
        elif fits:
            text = "✓ The proposal fits. Review the changes:"
        else:
            text = "✕ Even the proposal does not fit. Review the changes:"
        self.verdict = QLabel(text)
        self.verdict.setObjectName("Verdict")
        self.verdict.setProperty("fits", fits and not review.worse)
        self.verdict.setWordWrap(True)
        lay.addWidget(self.verdict)
        self.limits = QLabel("\n".join("• " + line for line in review.limits))
        self.limits.setObjectName("Error")
        self.limits.setWordWrap(True)
        self.limits.setVisible(bool(review.limits))
        lay.addWidget(self.limits)
        self.table = QTableWidget(len(rows), 3)
        self.table.setHorizontalHeaderLabels(["", "Now", "Proposed"])
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                self.table.setItem(r, c, QTableWidgetItem(text))
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().hide()
        lay.addWidget(self.table)
        costs = cost_rows(review)
        self.costs = QTableWidget(len(costs), 3)
        self.costs.setHorizontalHeaderLabels(["", "Now", "Proposed"])
        for r, row in enumerate(costs):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.costs.setItem(r, c, item)
        self.costs.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.costs.verticalHeader().hide()
        self.costs.resizeRowsToContents()
        self.costs.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.costs.setFixedHeight(self.costs.horizontalHeader().sizeHint().height()
                                  + self.costs.verticalHeader().length() + 2 * self.costs.frameWidth() + 2)
        lay.addWidget(self.costs)
        notes = QLabel("\n".join("• " + n for n in review.proposal.notes))
        notes.setObjectName("Muted")
        notes.setWordWrap(True)
        lay.addWidget(notes)
        if not rows:
            lay.addWidget(QLabel("The current plan is already what Auto plan proposes."))
        self.alternative_buttons: list[QPushButton] = []
        if review.alternatives:
            head = QLabel("These would fit:")
            head.setObjectName("Section")
            lay.addWidget(head)
            for alt in review.alternatives:
                b = QPushButton(f"Use: {alt.label}")
                b.clicked.connect(lambda _=False, a=alt: self._choose(a))
                lay.addWidget(b)
                self.alternative_buttons.append(b)
        box = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.accept_btn = box.addButton("Apply proposal", QDialogButtonBox.ButtonRole.AcceptRole)
        self.accept_btn.setEnabled(bool(rows) and not review.worse)
        box.accepted.connect(self.accept)
        box.rejected.connect(self.reject)
        lay.addWidget(box)
        self.resize(760, 480)

    def _choose(self, alt: Alternative) -> None:
        self.choice = alt
        self.accept()


def cost_rows(review: AutoPlanReview) -> list[tuple[str, str, str]]:
    """``(what, now, proposed)``: the predicted seconds per step and per picture (with the
    load) and, where a device has no measured profile, which speeds they assume (when the
    review has times), then each device's planned memory against what it has free (GiB;
    ``unused`` where the plan puts nothing)."""
    from sdplan.core.planning.modules import GIB
    from sdplan.core.planning.timing import seconds_text

    rows = []
    now_t, new_t = review.current_time, review.time
    if now_t is not None and new_t is not None:
        rows.append(("per step", f"~{seconds_text(now_t.step_s)} s", f"~{seconds_text(new_t.step_s)} s"))
        rows.append(("per picture", *(f"~{seconds_text(t.image_s)} s (load {seconds_text(t.load_s)} s)"
                                      for t in (now_t, new_t))))
        if not (now_t.measured and new_t.measured):
            rows.append(("speeds", *("measured" if t.measured else "default speeds (sdplan devices --calibrate)"
                                     for t in (now_t, new_t))))
    now, new = review.current_fit.devices, review.fit.devices
    for d in dict.fromkeys([*now, *new]):
        def used(devices: dict, name: str = d) -> str:
            t = devices.get(name)
            return f"{t.total / GIB:.2f} of {t.free / GIB:.2f} GiB free" if t is not None else "unused"
        rows.append((f"{d} memory", used(now), used(new)))
    return rows


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
