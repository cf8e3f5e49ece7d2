"""Colours, spacing and the application style sheet (views only; no behaviour).

One accent colour, neutral surfaces taken from the system palette (so light and dark themes
follow the system), and one fixed colour per module used everywhere a module appears:
cards, memory-bar segments and split strips.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QColor, QGuiApplication, QPalette

#: Per-module colours (hue families chosen to stay distinct in light and dark themes).
MODULE_COLOURS: dict[str, str] = {
    "diffusion": "#5B8DEF",
    "te": "#E0A03A",
    "clip_vision": "#9B7BE0",
    "vae": "#3FB68B",
    "controlnet": "#E06C9F",
    "photomaker": "#C98A5B",
    "upscaler": "#4CB3C9",
    "detector": "#A0A94A",
}
#: Human-readable module names for card titles.
MODULE_TITLES: dict[str, str] = {
    "diffusion": "Diffusion model", "te": "Text encoders", "clip_vision": "CLIP vision",
    "vae": "VAE", "controlnet": "ControlNet", "photomaker": "PhotoMaker",
    "upscaler": "Upscaler", "detector": "Detector",
}
ACCENT = "#3D7BFD"
DANGER = "#E5484D"
WARNING = "#D39E1A"
OK = "#30A46C"

#: Spacing unit in logical pixels; layouts use multiples of it.
UNIT = 4


def module_colour(module: str) -> QColor:
    """The module's colour (grey for names outside :data:`MODULE_COLOURS`)."""
    return QColor(MODULE_COLOURS.get(module, "#8A8F98"))


@dataclass(frozen=True)
class Theme:
    """Resolved surface colours for the current palette."""

    dark: bool
    window: QColor
    surface: QColor
    raised: QColor
    border: QColor
    text: QColor
    muted: QColor
    track: QColor

    @property
    def accent(self) -> QColor:
        return QColor(ACCENT)

    @property
    def danger(self) -> QColor:
        return QColor(DANGER)


def is_dark(palette: QPalette | None = None) -> bool:
    """True when the palette's window colour is dark (the system uses a dark theme)."""
    pal = palette or QGuiApplication.palette()
    return pal.color(QPalette.ColorRole.Window).lightness() < 128


def current(mode: str = "system") -> Theme:
    """The theme for ``mode`` (``system``, ``light`` or ``dark``)."""
    dark = is_dark() if mode == "system" else mode == "dark"
    if dark:
        return Theme(True, QColor("#16181C"), QColor("#1E2126"), QColor("#262A30"),
                     QColor("#33383F"), QColor("#E6E8EB"), QColor("#9BA1AA"), QColor("#2C3036"))
    return Theme(False, QColor("#F4F5F7"), QColor("#FFFFFF"), QColor("#FAFBFC"),
                 QColor("#DADDE2"), QColor("#1C1F24"), QColor("#6B7280"), QColor("#E9EBEF"))


def palette(theme: Theme) -> QPalette:
    """A Fusion-style palette for ``theme`` with the accent as highlight."""
    p = QPalette()
    R = QPalette.ColorRole
    p.setColor(R.Window, theme.window)
    p.setColor(R.WindowText, theme.text)
    p.setColor(R.Base, theme.surface)
    p.setColor(R.AlternateBase, theme.raised)
    p.setColor(R.Text, theme.text)
    p.setColor(R.Button, theme.raised)
    p.setColor(R.ButtonText, theme.text)
    p.setColor(R.ToolTipBase, theme.raised)
    p.setColor(R.ToolTipText, theme.text)
    p.setColor(R.PlaceholderText, theme.muted)
    p.setColor(R.Highlight, QColor(ACCENT))
    p.setColor(R.HighlightedText, QColor("#FFFFFF"))
    p.setColor(R.Link, QColor(ACCENT))
    p.setColor(QPalette.ColorGroup.Disabled, R.Text, theme.muted)
    p.setColor(QPalette.ColorGroup.Disabled, R.ButtonText, theme.muted)
    p.setColor(QPalette.ColorGroup.Disabled, R.WindowText, theme.muted)
    return p


def style_sheet(theme: Theme) -> str:
    """The application style sheet: cards, columns, section headers, buttons."""
    t = theme
    return f"""
QWidget {{ font-size: 10pt; }}
QToolTip {{ background: {t.raised.name()}; color: {t.text.name()};
           border: 1px solid {t.border.name()}; padding: 6px; }}
QFrame#DeviceColumn, QFrame#DefaultTarget, QFrame#Panel {{
    background: {t.surface.name()}; border: 1px solid {t.border.name()}; border-radius: 8px; }}
QFrame#DeviceColumn[dropHover="true"], QFrame#DefaultTarget[dropHover="true"] {{
    border: 2px solid {ACCENT}; }}
QFrame#DeviceColumn[over="true"] {{ border: 1px solid {DANGER}; }}
QFrame#ModuleCard {{ background: {t.raised.name()}; border: 1px solid {t.border.name()};
    border-radius: 6px; }}
QFrame#ModuleCard[over="true"] {{ border: 1px solid {DANGER}; }}
QFrame#ModuleCard:focus {{ border: 1px solid {ACCENT}; }}
QLabel#Title {{ font-size: 11pt; font-weight: 600; }}
QLabel#Muted, QLabel#Caption {{ color: {t.muted.name()}; }}
QLabel#Caption {{ font-size: 8.5pt; }}
QLabel#Section {{ color: {t.muted.name()}; font-size: 8.5pt; font-weight: 600;
    letter-spacing: 0.5px; }}
QLabel#Error {{ color: {DANGER}; }}
QLabel#Warning {{ color: {WARNING}; font-size: 8.5pt; }}
QLabel#Badge {{ background: {t.track.name()}; color: {t.muted.name()}; border-radius: 4px;
    padding: 1px 6px; font-size: 8.5pt; }}
QLabel#Verdict[fits="true"] {{ color: {OK}; font-weight: 600; }}
QLabel#Verdict[fits="false"] {{ color: {DANGER}; font-weight: 600; }}
QPushButton#Primary {{ background: {ACCENT}; color: white; border: none; border-radius: 6px;
    padding: 6px 14px; font-weight: 600; }}
QPushButton#Primary:disabled {{ background: {t.track.name()}; color: {t.muted.name()}; }}
QToolButton#Segment {{ border: 1px solid {t.border.name()}; padding: 2px 6px;
    background: {t.surface.name()}; font-size: 8.5pt; }}
QToolButton#Segment:checked {{ background: {ACCENT}; color: white; border-color: {ACCENT}; }}
QToolButton#Segment:focus {{ border: 2px solid {ACCENT}; padding: 1px 5px; }}
QToolButton#Segment:checked:focus {{ border: 2px solid {t.text.name()}; }}
QLineEdit, QPlainTextEdit {{
    border: 1px solid {t.border.name()}; border-radius: 5px; padding: 3px 6px;
    background: {t.surface.name()}; }}
QLineEdit:focus, QPlainTextEdit:focus {{ border: 1px solid {ACCENT}; }}
QLineEdit[error="true"] {{ border: 1px solid {DANGER}; }}
QScrollArea {{ border: none; background: transparent; }}
QToolBar {{ border: none; spacing: 6px; padding: 4px 8px; }}
QStatusBar {{ color: {t.muted.name()}; }}
"""
