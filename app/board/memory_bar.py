"""A device's memory bar: in use by others, the plan's bytes stacked per module (resident
weights solid, staged range hatched, compute light), the reserved headroom, and the
``--max-vram`` budget as a marker that can be dragged."""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QMouseEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget
from sdplan.app import theme

GIB = 1 << 30


@dataclass
class BarData:
    """What a bar shows (bytes). ``segments``: ``(module, part, bytes)`` with part
    ``weights``, ``lora`` (LoRA tensors kept beside the weights), ``staging`` or ``compute``;
    ``budget`` 0 = none."""

    total: int = 0
    free: int = 0
    segments: list[tuple[str, str, int]] = field(default_factory=list)
    headroom: int = 0
    budget: int = 0
    budget_enabled: bool = False
    over: bool = False


def paint_part(p: QPainter, rect: QRectF, part: str, colour: QColor, t: theme.Theme) -> None:
    """Fill ``rect`` the way the bar draws ``part``: ``weights`` solid, ``lora`` solid and
    dotted, ``staging`` light
    and hatched, ``compute`` translucent, ``headroom`` a muted cross-hatch, ``others``
    (memory used by other programs) grey. Leaves the pen off."""
    p.setPen(Qt.PenStyle.NoPen)
    if part == "weights":
        p.setBrush(colour)
    elif part == "lora":
        p.setBrush(colour)
        p.drawRect(rect)
        p.setBrush(QBrush(colour.lighter(160), Qt.BrushStyle.Dense5Pattern))
    elif part == "staging":
        p.setBrush(colour.lighter(125) if t.dark else colour.lighter(115))
        p.drawRect(rect)
        p.setBrush(QBrush(colour.darker(130), Qt.BrushStyle.BDiagPattern))
    elif part == "compute":
        light = QColor(colour)
        light.setAlpha(110)
        p.setBrush(light)
    elif part == "headroom":
        p.setBrush(QBrush(t.muted, Qt.BrushStyle.FDiagPattern))
    else:
        p.setBrush(t.muted.darker(110) if not t.dark else t.muted.darker(165))
    p.drawRect(rect)


#: Legend entries: (part, label, tooltip).
LEGEND = (
    ("others", "in use", "Memory other programs already use on the device"),
    ("weights", "resident weights", "Weights kept on the device between uses"),
    ("lora", "LoRA", "LoRA tensors added at runtime, kept beside the weights they patch "
     "(--lora-apply-mode at_runtime; merged LoRAs take no room)"),
    ("staging", "staged range", "Weights (or a block range) copied in while the module runs, "
     "then released: --params-backend, disk residency or --max-vram segments"),
    ("compute", "compute estimate", "Activations and work buffers of the module that needs "
     "the most at once (depends on image size and batch)"),
    ("headroom", "headroom", "Memory the layer-split rule keeps free on a GPU "
     "(free - 2 GiB, at most 7/8 of free)"),
    ("budget", "--max-vram", "The budget marker: drag it, or type a value in Budget"),
)


class MemoryLegend(QWidget):
    """One line of swatches naming what the memory bars draw (see :data:`LEGEND`)."""

    SWATCH = 12

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.theme = theme.current()
        policy = QSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self.setToolTip("\n".join(f"{label}: {tip}" for _, label, tip in LEGEND))

    def _items(self) -> list[tuple[str, str, float]]:
        fm = self.fontMetrics()
        return [(part, label, float(fm.horizontalAdvance(label))) for part, label, _ in LEGEND]

    def _rows(self, width: float) -> list[list[tuple[str, str, float]]]:
        """The entries in lines that fit ``width`` (whole entries; never cut)."""
        rows: list[list[tuple[str, str, float]]] = [[]]
        x = 0.0
        for part, label, w in self._items():
            step = self.SWATCH + 6 + w + 14
            if rows[-1] and x + step - 14 > width:
                rows.append([])
                x = 0.0
            rows[-1].append((part, label, w))
            x += step
        return rows

    def _line_h(self) -> int:
        return max(self.fontMetrics().height(), self.SWATCH) + 4

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        gap = self.SWATCH + 6 + 14
        width = sum(w + gap for _, _, w in self._items())
        return QSize(int(width), self._line_h())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        widest = max(w for _, _, w in self._items()) + self.SWATCH + 6
        return QSize(int(widest), self._line_h())

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt's name
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt's name
        return self._line_h() * len(self._rows(width))

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802
        t = self.theme = theme.current()  # follows theme switches
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        sample = QColor(theme.ACCENT).lighter(110)
        fm = self.fontMetrics()
        for r, row in enumerate(self._rows(self.width())):
            x = 0.0
            cy = self._line_h() * r + self._line_h() / 2
            for part, label, w in row:
                box = QRectF(x, cy - self.SWATCH / 2, self.SWATCH, self.SWATCH)
                if part == "budget":
                    p.setPen(QPen(QColor(theme.ACCENT), 2))
                    p.drawLine(QPointF(box.center().x(), box.top() - 1),
                               QPointF(box.center().x(), box.bottom() + 1))
                else:
                    paint_part(p, box, part, sample, t)
                p.setPen(t.muted)
                p.drawText(QPointF(x + self.SWATCH + 6, cy + fm.ascent() / 2 - 1), label)
                x += self.SWATCH + 6 + w + 14
        p.end()


class MemoryBar(QWidget):
    """Paints :class:`BarData`; emits ``budgetDragged(gib)`` while the marker is dragged
    (0 removes the budget when dragged to the far left), and once where the bar is
    double-clicked or Ctrl+clicked (the marker is placed there)."""

    budgetDragged = Signal(float)
    budgetReleased = Signal()

    BAR_H = 14

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.data = BarData()
        self._dragging = False
        self.setMinimumHeight(self.BAR_H + 10)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMouseTracking(True)
        self.theme = theme.current()

    def set_data(self, data: BarData) -> None:
        self.data = data
        self.update()

    # ------------------------------------------------------------------ geometry
    def _scale(self) -> float:
        d = self.data
        used = d.total - d.free + sum(b for _, _, b in d.segments)
        span = max(d.total, used, 1)
        return (self.width() - 2) / span

    def _marker_x(self) -> float | None:
        d = self.data
        if not d.budget_enabled or d.budget <= 0:
            return None
        return 1 + (d.total - d.free + d.budget) * self._scale()

    # ------------------------------------------------------------------ painting
    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802
        d, t = self.data, self.theme
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        k = self._scale()
        top = 5.0
        track = QRectF(1, top, max(d.total * k, 2), self.BAR_H)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(t.track)
        p.drawRoundedRect(track, 4, 4)
        p.save()
        clip = QRectF(1, top, self.width() - 2, self.BAR_H)
        from PySide6.QtGui import QPainterPath

        path = QPainterPath()
        path.addRoundedRect(clip, 4, 4)
        p.setClipPath(path)
        x = 1.0
        others = (d.total - d.free) * k
        paint_part(p, QRectF(x, top, others, self.BAR_H), "others", t.muted, t)
        x += others
        for module, part, nbytes in d.segments:
            w = nbytes * k
            if w <= 0:
                continue
            paint_part(p, QRectF(x, top, w, self.BAR_H), part, theme.module_colour(module), t)
            p.setPen(QPen(t.surface, 1))
            p.drawLine(QPointF(x + w, top), QPointF(x + w, top + self.BAR_H))
            p.setPen(Qt.PenStyle.NoPen)
            x += w
        if d.headroom > 0:
            hx = 1 + (d.total - d.headroom) * k
            paint_part(p, QRectF(hx, top, d.headroom * k, self.BAR_H), "headroom", t.muted, t)
        if x > 1 + d.total * k:  # past the device's memory
            p.setBrush(QColor(theme.DANGER))
            p.drawRect(QRectF(1 + d.total * k, top, x - 1 - d.total * k, self.BAR_H))
        p.restore()
        if d.over:
            p.setPen(QPen(QColor(theme.DANGER), 1.5))
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRoundedRect(track.adjusted(-0.5, -0.5, 0.5, 0.5), 4, 4)
        mx = self._marker_x()
        if mx is not None:
            p.setPen(QPen(QColor(theme.ACCENT), 2))
            p.drawLine(QPointF(mx, top - 4), QPointF(mx, top + self.BAR_H + 4))
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(QColor(theme.ACCENT))
            tri = [QPointF(mx - 4, top - 5), QPointF(mx + 4, top - 5), QPointF(mx, top)]
            p.drawPolygon(tri)
        p.end()

    # ------------------------------------------------------------------ budget drag
    def _gib_at(self, x: float) -> float:
        d = self.data
        nbytes = (x - 1) / self._scale() - (d.total - d.free)
        return max(0.0, min(nbytes, d.free) / GIB)

    def mousePressEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        if not self.data.budget_enabled or event.button() != Qt.MouseButton.LeftButton:
            return super().mousePressEvent(event)
        mx = self._marker_x()
        x = event.position().x()
        if mx is None or abs(x - mx) <= 6 or event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self._dragging = True
            self.budgetDragged.emit(round(self._gib_at(x), 1))
        event.accept()

    def mouseDoubleClickEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        """A double-click places the budget marker where it is (no modifier: window
        managers take Alt+click to move windows)."""
        if not self.data.budget_enabled or event.button() != Qt.MouseButton.LeftButton:
            return super().mouseDoubleClickEvent(event)
        self._dragging = False
        self.budgetDragged.emit(round(self._gib_at(event.position().x()), 1))
        self.budgetReleased.emit()
        event.accept()

    def mouseMoveEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        mx = self._marker_x()
        near = mx is not None and abs(event.position().x() - mx) <= 6
        self.setCursor(Qt.CursorShape.SizeHorCursor if near or self._dragging
                       else Qt.CursorShape.ArrowCursor)
        if self._dragging:
            self.budgetDragged.emit(round(self._gib_at(event.position().x()), 1))

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        if self._dragging:
            self._dragging = False
            self.budgetReleased.emit()
