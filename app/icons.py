"""Icons drawn with QPainter (no image files): device types, the app icon, small glyphs."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap


def _canvas(size: int, ratio: float) -> tuple[QPixmap, QPainter]:
    pm = QPixmap(int(size * ratio), int(size * ratio))
    pm.setDevicePixelRatio(ratio)
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    return pm, p


def device_pixmap(kind: str, colour: QColor, size: int = 20, ratio: float = 2.0) -> QPixmap:
    """A device-type glyph: ``gpu``/``igpu`` (a card with a fan), ``cpu`` (a chip with
    pins), ``rpc`` (a networked box), ``accel`` (a chip with a bolt)."""
    pm, p = _canvas(size, ratio)
    s = size
    pen = QPen(colour, max(1.4, s / 14))
    p.setPen(pen)
    if kind in ("gpu", "igpu"):
        p.drawRoundedRect(QRectF(s * .08, s * .25, s * .84, s * .5), 2, 2)
        p.drawEllipse(QPointF(s * .38, s * .5), s * .14, s * .14)
        p.drawLine(QPointF(s * .62, s * .4), QPointF(s * .82, s * .4))
        p.drawLine(QPointF(s * .62, s * .6), QPointF(s * .82, s * .6))
        p.drawLine(QPointF(s * .2, s * .75), QPointF(s * .2, s * .88))
        p.drawLine(QPointF(s * .5, s * .75), QPointF(s * .5, s * .88))
    elif kind == "rpc":
        p.drawRoundedRect(QRectF(s * .2, s * .12, s * .6, s * .42), 2, 2)
        p.drawLine(QPointF(s * .5, s * .54), QPointF(s * .5, s * .75))
        p.drawLine(QPointF(s * .12, s * .75), QPointF(s * .88, s * .75))
        p.drawEllipse(QPointF(s * .5, s * .82), s * .06, s * .06)
    else:
        p.drawRoundedRect(QRectF(s * .25, s * .25, s * .5, s * .5), 2, 2)
        for i in range(3):
            t = s * (.35 + .15 * i)
            p.drawLine(QPointF(t, s * .1), QPointF(t, s * .25))
            p.drawLine(QPointF(t, s * .75), QPointF(t, s * .9))
            p.drawLine(QPointF(s * .1, t), QPointF(s * .25, t))
            p.drawLine(QPointF(s * .75, t), QPointF(s * .9, t))
        if kind == "accel":
            path = QPainterPath(QPointF(s * .52, s * .32))
            path.lineTo(s * .42, s * .52)
            path.lineTo(s * .56, s * .5)
            path.lineTo(s * .46, s * .68)
            p.drawPath(path)
    p.end()
    return pm


def app_icon() -> QIcon:
    """sdplan's icon: three stacked bars (a placement board) on an accent tile."""
    icon = QIcon()
    for size in (16, 32, 64, 128, 256):
        pm, p = _canvas(size, 1.0)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QColor("#3D7BFD"))
        p.drawRoundedRect(QRectF(0, 0, size, size), size * .22, size * .22)
        colours = ("#FFFFFF", "#CFE0FF", "#9EBFFF")
        widths = (.62, .44, .28)
        for i, (c, w) in enumerate(zip(colours, widths, strict=True)):
            p.setBrush(QColor(c))
            p.drawRoundedRect(QRectF(size * .19, size * (.24 + i * .2), size * w, size * .13),
                              size * .05, size * .05)
        p.end()
        icon.addPixmap(pm)
    return icon


def dot_pixmap(colour: QColor, size: int = 10, ratio: float = 2.0) -> QPixmap:
    """A filled circle (module colour swatch in menus)."""
    pm, p = _canvas(size, ratio)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(colour)
    p.drawEllipse(QRectF(1, 1, size - 2, size - 2))
    p.end()
    return pm
