"""A device's memory bar: in use by others, the plan's bytes stacked per module (resident
weights solid, staged range hatched, compute light), the reserved headroom, and the
``--max-vram`` budget as a marker that can be dragged."""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QMouseEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget
from sdplan.app import theme

GIB = 1 << 30


@dataclass
class BarData:
    """What a bar shows (bytes). ``segments``: ``(module, part, bytes)`` with part
    ``weights``, ``staging`` or ``compute``; ``budget`` 0 = none."""

    total: int = 0
    free: int = 0
    segments: list[tuple[str, str, int]] = field(default_factory=list)
    headroom: int = 0
    budget: int = 0
    budget_enabled: bool = False
    over: bool = False


class MemoryBar(QWidget):
    """Paints :class:`BarData`; emits ``budgetDragged(gib)`` while the marker is dragged
    (0 removes the budget when dragged to the far left)."""

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
        p.setBrush(t.muted.darker(110) if not t.dark else t.border.lighter(130))
        p.drawRect(QRectF(x, top, others, self.BAR_H))
        x += others
        for module, part, nbytes in d.segments:
            w = nbytes * k
            if w <= 0:
                continue
            c = theme.module_colour(module)
            rect = QRectF(x, top, w, self.BAR_H)
            if part == "weights":
                p.setBrush(c)
            elif part == "staging":
                p.setBrush(c.lighter(125) if t.dark else c.lighter(115))
                p.drawRect(rect)
                p.setBrush(QBrush(c.darker(130), Qt.BrushStyle.BDiagPattern))
            else:
                light = QColor(c)
                light.setAlpha(110)
                p.setBrush(light)
            p.drawRect(rect)
            p.setPen(QPen(t.surface, 1))
            p.drawLine(QPointF(x + w, top), QPointF(x + w, top + self.BAR_H))
            p.setPen(Qt.PenStyle.NoPen)
            x += w
        if d.headroom > 0:
            hx = 1 + (d.total - d.headroom) * k
            p.setBrush(QBrush(t.muted, Qt.BrushStyle.FDiagPattern))
            p.drawRect(QRectF(hx, top, d.headroom * k, self.BAR_H))
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
        if mx is None or abs(x - mx) <= 6 or event.modifiers() & Qt.KeyboardModifier.AltModifier:
            self._dragging = True
            self.budgetDragged.emit(round(self._gib_at(x), 1))
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
