"""The timeline's frame: its size and layout in pixels, its colours, the clock's scale, money as
text, the width and placement of labels, and the canvas that Agg draws.

Nothing here knows an episode: `tracks` and `timeline` draw a case with these. matplotlib (Agg
through `FigureCanvasAgg`: no pyplot, so no global figure state) is imported on the first
measure or draw, so `finality_gym` imports without it.
"""

from __future__ import annotations

import numpy as np

from . import readings
from .tasks import HANDOVER_AT, HORIZON, SHIP_BY

WIDTH, HEIGHT, DPI = 1280, 800, 100
FRAME_SHAPE = (HEIGHT, WIDTH, 3)

# ----------------------------------------------------------------- layout (pixels, y down)
X0, X1 = 150, 1262            # the clock's extent
SPLIT_AT = 0.62               # share of that width for t = 120..600
HEADER_Y = 8
MARKS_Y = (80, 92)            # the rows naming the vertical lines (now, end, t_det)
TRUTH = (102, 96)             # (top, height) of each track
PROCESSOR_TRACK = (204, 72)
LEDGER_TRACK = (282, 72)
ERP_TRACK = (360, 72)
BANK_TRACK = (438, 72)
CALLS = (516, 120)
AXIS_Y = 650
FOOTER_Y = 700
ROW = 14                      # one label row
LEGEND_X, LEGEND_Y = 830, 684  # the legend's top left
FOOTER_WIDTH = 780            # the outcome's lines, left of the legend
FONT = 7.5                    # points, the labels' size

# ----------------------------------------------------------------- colours by meaning
PAID = "#2f9e44"      # settled, paid, cash in
PENDING = "#f08c00"   # submitted, pending, unknown
FAILED = "#e03131"    # declined, payment failed
RETURNED = "#7048e8"  # refunded, voided, charged back
SHIPPED = "#1971c2"   # goods shipped (and the "now" line)
NOTHING = "#ced4da"   # nothing shown yet
NEUTRAL = "#343a40"
FAINT = "#868e96"
TDET = "#c2255c"
RETRY = "#0c8599"
FAULT = "#212529"     # a fault's star and label
LEGEND = ((PAID, "settled · paid · cash in"), (PENDING, "submitted · pending · unknown"),
          (FAILED, "declined · payment failed"), (RETURNED, "refunded · voided · charged back"),
          (SHIPPED, "goods shipped"), (NOTHING, "nothing shown (yet)"))
# the colour of each state a result reads as (`readings`); the legend says the same
STATE_COLOUR = {readings.SUBMITTED: PENDING, readings.UNKNOWN: PENDING, readings.PENDING: PENDING,
                readings.SETTLED: PAID, readings.FAILED_SOFT: FAILED, readings.FAILED_HARD: FAILED,
                readings.REVERSED: RETURNED, readings.SHIPPED: SHIPPED,
                readings.NOTHING: NOTHING}
# (tool, track name, letter, (top, height), what the label shows)
SYSTEMS = (("read_processor", "processor", "P", PROCESSOR_TRACK, "capture status"),
           ("read_ledger", "ledger", "L", LEDGER_TRACK, "cash · clearing"),
           ("read_erp", "ERP", "E", ERP_TRACK, "order status"),
           ("read_bank", "bank", "B", BANK_TRACK, "statement lines"))


def x_of(t: float) -> float:
    """The pixel column of time t (clamped to the hand-over and the horizon)."""
    t = min(max(t, HANDOVER_AT), HORIZON)
    split = X0 + SPLIT_AT * (X1 - X0)
    if t <= SHIP_BY:
        return X0 + (t - HANDOVER_AT) / (SHIP_BY - HANDOVER_AT) * (split - X0)
    return split + (t - SHIP_BY) / (HORIZON - SHIP_BY) * (X1 - split)


def usd(cents: int, sign: bool = False) -> str:
    text = f"${abs(cents) / 100:,.2f}"
    if cents < 0:
        return "\u2212" + text
    return ("+" + text) if sign and cents > 0 else text


_ADVANCES: dict[tuple[float, bool, str], float] = {}  # font metrics only: no episode's data


def text_width(text: str, size: float = FONT, bold: bool = False) -> float:
    """A label's width in pixels: the sum of its characters' advances as Agg's hinting rounds
    them at this size (differently at each), a pixel more; a little over what Agg draws where
    kerning pulls a pair together. Each advance is looked up once a process."""
    missing = {ch for ch in text if (size, bold, ch) not in _ADVANCES}
    if missing:
        from matplotlib import font_manager
        from matplotlib.backends.backend_agg import get_hinting_flag
        font = font_manager.get_font(font_manager.findfont(font_manager.FontProperties(
            weight="bold" if bold else "normal")))
        font.set_size(size, DPI)
        for ch in missing:
            _ADVANCES[size, bold, ch] = font.load_char(ord(ch), get_hinting_flag()).horiAdvance / 64
    return sum(_ADVANCES[size, bold, ch] for ch in text) + 1


# ----------------------------------------------------------------- label placement
class Rows:
    """Placement of left-aligned labels in a few rows: a label takes the first row where its
    span is free, or moves right to the nearest free span of any row (a leader joins it to its
    mark); with neither it is left out (the mark and the band still show). The spans taken are
    kept per row, so labels placed later (a track's faults, after its reads) fill the gaps."""

    def __init__(self, ys: list[float]):
        self.ys = ys
        self.taken: list[list[tuple[float, float]]] = [[] for _ in ys]

    def place(self, x: float, width: float, gap: float = 6,
              shift: float = 0) -> tuple[float, float] | None:
        x = max(min(x, WIDTH - 6 - width), X0 - 4)  # never over the track names
        best = None
        for i, spans in enumerate(self.taken):
            spot = min(at for at in [x] + [end + gap for _, end in spans if end + gap > x]
                       if all(at + width + gap <= start or at >= end + gap
                              for start, end in spans))
            if spot == x:
                best = (x, i)
                break
            if best is None or spot < best[0]:
                best = (spot, i)
        spot, i = best
        if spot - x > shift or spot + width > WIDTH - 6:
            return None
        self.taken[i].append((spot, spot + width))
        return spot, self.ys[i]


# ----------------------------------------------------------------- drawing
class Canvas:
    """Collects rectangles, lines, markers and texts (in pixels, y down), then draws them with
    a few collections."""

    def __init__(self):
        self.rects: list[tuple] = []     # (x, y, w, h, colour, z)
        self.lines: list[tuple] = []     # ((x0, y0), (x1, y1), colour, width, style, z)
        self.marks: dict = {}            # (marker, size) -> [(x, y, colour)]
        self.texts: list[tuple] = []     # (x, y, text, kwargs)

    def rect(self, x, y, w, h, colour, z=1.0):
        """z: 0 for backgrounds, under the grid (0.5); 1 for bands, over it."""
        self.rects.append((x, y, w, h, colour, z))

    def line(self, x0, y0, x1, y1, colour=NEUTRAL, width=1.0, style="solid", z=2.0):
        self.lines.append(((x0, y0), (x1, y1), colour, width, style, z))

    def mark(self, x, y, colour, marker="o", size=30):
        self.marks.setdefault((marker, size), []).append((x, y, colour))

    def text(self, x, y, text, box=False, **kwargs):
        """box: a translucent white patch behind the text, so that the vertical lines that
        cross a label row do not cross its letters."""
        if box:
            size = kwargs.get("fontsize", FONT)
            w = text_width(text, size, kwargs.get("weight") == "bold")
            h = size * DPI / 72 + 2
            self.rects.append((x - 1, y - h / 2, w + 2, h, (1, 1, 1, 0.85), 3.0))
        self.texts.append((x, y, text, kwargs))

    def render(self, ax) -> None:
        from matplotlib.collections import LineCollection, PolyCollection
        by_z: dict = {}
        for x, y, w, h, colour, z in self.rects:
            by_z.setdefault(z, []).append((((x, y), (x + w, y), (x + w, y + h), (x, y + h)),
                                           colour))
        for z, rects in by_z.items():
            ax.add_collection(PolyCollection([r for r, _ in rects],
                                             facecolors=[c for _, c in rects],
                                             edgecolors="none", linewidths=0, zorder=z))
        by_style: dict = {}
        for p0, p1, colour, width, style, z in self.lines:
            by_style.setdefault((width, style, z), []).append((p0, p1, colour))
        for (width, style, z), segs in by_style.items():
            ax.add_collection(LineCollection([(a, b) for a, b, _ in segs],
                                             colors=[c for _, _, c in segs], linewidths=width,
                                             linestyles=style, zorder=z))
        for (marker, size), points in self.marks.items():
            ax.scatter([p[0] for p in points], [p[1] for p in points], s=size,
                       c=[p[2] for p in points], marker=marker, linewidths=0.6,
                       edgecolors="white", zorder=3)
        for x, y, text, kwargs in self.texts:
            options = {"fontsize": FONT, "va": "center", "ha": "left", "color": NEUTRAL,
                       "zorder": 4, "parse_math": False}
            options.update(kwargs)
            ax.text(x, y, text, **options)


def figure(*canvases: Canvas):
    """A figure of the frame's size with the canvases rendered into its one axes, in pixels;
    (figure, axes, Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI, facecolor="white")
    agg = FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(HEIGHT, 0)
    ax.set_axis_off()  # and with it the axes' own background: the layer below shows
    for canvas in canvases:
        canvas.render(ax)
    return fig, ax, agg


def rgba(canvas: Canvas, background: np.ndarray | None = None) -> np.ndarray:
    """The canvas drawn by Agg over `background` (RGBA), as a new RGBA array."""
    fig, _, agg = figure(canvas)
    renderer = agg.get_renderer()
    renderer.clear()
    if background is not None:  # start from the shared layer instead of a blank page
        np.asarray(agg.buffer_rgba())[...] = background
        fig.patch.set_visible(False)
    fig.draw(renderer)
    image = np.array(agg.buffer_rgba(), dtype=np.uint8)
    assert image.shape == (HEIGHT, WIDTH, 4), image.shape
    return image

