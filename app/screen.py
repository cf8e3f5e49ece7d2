"""The window on the user's screen: a first size that fits the available screen (never
larger, frame included), a saved geometry brought back onto it, and the height under which
the flags fold so the board keeps the space."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize

#: The first window's size where the screen has room (pixels).
WANTED = QSize(1440, 900)
#: Room kept for the window manager's frame before the window is shown and its real frame
#: is known (pixels): a title bar above, borders on the other sides.
FRAME_TITLE = 32
FRAME_BORDER = 8
#: Windows shorter than this fold the flags (unless the user chose): the board takes the
#: space.
FOLD_BELOW = 800


def first_geometry(available: QRect, wanted: QSize = WANTED, title: int = FRAME_TITLE,
                   border: int = FRAME_BORDER) -> QRect:
    """The first window's client geometry on a screen whose available area is ``available``:
    ``wanted`` where it fits with a frame (``title`` px above, ``border`` px on the other
    sides) around it, else the available area less that frame; centred. The framed window
    never extends past ``available``."""
    fw, fh = 2 * border, title + border
    w = max(min(wanted.width(), available.width() - fw), 1)
    h = max(min(wanted.height(), available.height() - fh), 1)
    x = available.x() + (available.width() - w - fw) // 2 + border
    y = available.y() + (available.height() - h - fh) // 2 + title
    return QRect(x, y, w, h)


def fitted(frame: QRect, client: QRect, available: QRect) -> QRect | None:
    """The client geometry that brings a shown window (``frame``: with its frame,
    ``client``: without) inside ``available``, or None when it is inside already."""
    if available.contains(frame):
        return None
    extra_w, extra_h = frame.width() - client.width(), frame.height() - client.height()
    w = min(client.width(), available.width() - extra_w)
    h = min(client.height(), available.height() - extra_h)
    x = min(max(frame.x(), available.x()), available.right() + 1 - (w + extra_w))
    y = min(max(frame.y(), available.y()), available.bottom() + 1 - (h + extra_h))
    left, top = client.x() - frame.x(), client.y() - frame.y()
    return QRect(x + left, y + top, max(w, 1), max(h, 1))
