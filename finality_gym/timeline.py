"""The `rgb_array` rendering of an episode: one timeline image of the case so far.

`draw(episode)` returns a `uint8` array of shape `FRAME_SHAPE` (800 x 1280 RGB), the same for
every episode and step. The x axis is the clock from the hand-over (t=120) to the horizon
(t=1800), wider up to the ship-by deadline (t=600), where nearly every call falls. Tracks, top
to bottom:

- truth: the canonical log (`docs/world.md` section 2) and `t_det`, drawn only once the case
  has ended; while it runs the track is an empty box saying so;
- processor, ledger, ERP, bank: at every read the agent made, what the system showed (a band
  coloured by what the view means, from that read to the next, and a label where it changed);
- agent calls: reads, probes with their answer, waits as spans, retries with their key, refused
  calls and the disposition;
- below: the outcome (disposition, position, reference, gap) once the case has ended.

What the picture may show is split in two: `_public_view` reads only what the agent was told
(the order value, the probe arm, the clock, the calls and their results), and `_truth_view` runs
only for an ended episode. So while a case runs, the two halves of a twin pair render the same
image byte for byte before `t_det`, and no frame ever names the task, its archetype, its fate
or its twin half.

matplotlib (Agg through `FigureCanvasAgg`: no pyplot, so no global figure state) is imported on
the first draw, so `finality_gym` imports without it. The layer that is the same in every frame
(grid, track names, axis, legend) is drawn once per process and cached; it holds nothing of any
episode.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .episode import PROBE_DELAY
from .tasks import (CALL_BUDGET, CAPTURE_SUBMITTED_AT, ESCALATION_DELAY, HANDOVER_AT, HORIZON,
                    SHIP_BY)

WIDTH, HEIGHT, DPI = 1280, 800, 100
FRAME_SHAPE = (HEIGHT, WIDTH, 3)

# ----------------------------------------------------------------- layout (pixels, y down)
X0, X1 = 150, 1262            # the clock's extent
SPLIT_AT = 0.62               # share of that width for t = 120..600
HEADER_Y = 8
MARKS_Y = (80, 92)            # the rows naming the vertical lines (now, end, t_det)
TRUTH = (102, 96)             # (top, height) of each track
PROCESSOR = (204, 72)
LEDGER = (282, 72)
ERP = (360, 72)
BANK = (438, 72)
CALLS = (516, 120)
AXIS_Y = 650
FOOTER_Y = 700
ROW = 14                      # one label row
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
LEGEND = ((PAID, "settled · paid · cash in"), (PENDING, "submitted · pending · unknown"),
          (FAILED, "declined · payment failed"), (RETURNED, "refunded · voided · charged back"),
          (SHIPPED, "goods shipped"), (NOTHING, "nothing shown (yet)"))
_STATUS_COLOUR = {"submitted": PENDING, "unknown": PENDING, "settled": PAID, "failed": FAILED,
                  "failed_soft": FAILED, "failed_hard": FAILED, "refunded": RETURNED,
                  "voided": RETURNED, "charged_back": RETURNED}
_ERP_COLOUR = {"placed": PENDING, "authorized": PENDING, "payment_pending": PENDING,
               "paid": PAID, "payment_failed": FAILED, "shipped": SHIPPED,
               "refunded": RETURNED, "disputed": RETURNED}
# (tool, track name, letter, (top, height), what the label shows)
_SYSTEMS = (("read_processor", "processor", "P", PROCESSOR, "capture status"),
            ("read_ledger", "ledger", "L", LEDGER, "cash · clearing"),
            ("read_erp", "ERP", "E", ERP, "order status"),
            ("read_bank", "bank", "B", BANK, "statement lines"))
_LETTER = {tool: letter for tool, _, letter, _, _ in _SYSTEMS}
_DISPOSITION_LABEL = {"ship": "SHIP", "refund": "REFUND", "write_off": "WRITE OFF",
                      "escalate": "ESCALATE", "close": "CLOSE"}


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


@lru_cache(maxsize=2)
def _advances(bold: bool) -> dict:
    """The advance width of each ASCII character, in ems, of the font the labels are drawn in
    (font metrics only: nothing of any episode)."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font, LoadFlags
    font = FT2Font(font_manager.findfont(font_manager.FontProperties(
        weight="bold" if bold else "normal")))
    return {chr(i): font.load_char(i, flags=LoadFlags.NO_SCALE).horiAdvance / font.units_per_EM
            for i in range(32, 127)}


def _width(text: str, size: float = FONT, bold: bool = False) -> float:
    """A label's width in pixels, a little over what Agg draws (it hints glyphs narrower at
    these sizes than their advances say)."""
    table = _advances(bold)
    return sum(table.get(ch, 0.84) for ch in text) * size * DPI / 72 * 0.96


# ----------------------------------------------------------------- what a result showed
def processor_view(result: dict) -> tuple[str, str, str | None]:
    """(label, cap1's colour, the newest other capture's colour or None)."""
    ops = result.get("operations") or []
    if not ops:
        return "no capture", NOTHING, None
    parts = [f"{op['op']} {op['status']}" + (f" ({op['decline']})" if op.get("decline") else "")
             for op in ops]
    first = next((o for o in ops if o["op"] == "cap1"), None)
    cap1 = NOTHING if first is None else _STATUS_COLOUR.get(first["status"], NEUTRAL)
    others = [o for o in ops if o["op"] != "cap1"]
    newest = _STATUS_COLOUR.get(others[-1]["status"], NEUTRAL) if others else None
    return ", ".join(parts), cap1, newest


def ledger_view(result: dict) -> tuple[str, str, str | None]:
    balances = result.get("balances") or {}
    cash, clearing = balances.get("cash", 0), balances.get("clearing", 0)
    entries = result.get("entries") or []
    if not entries:
        return "no entries", NOTHING, None
    label = f"cash {usd(cash)} · clearing {usd(clearing)}"
    if result.get("imbalance"):
        label += f" · imbalance {usd(result['imbalance'])}"
    memos = {e.get("memo") for e in entries}
    if cash > 0:
        colour = PAID
    elif "capture_failed" in memos:
        colour = FAILED
    elif memos & {"refunded", "chargeback"}:
        colour = RETURNED
    else:
        colour = PENDING
    return label, colour, None


def erp_view(result: dict) -> tuple[str, str, str | None]:
    status = result.get("status")
    if status is None:
        return "no status", NOTHING, None
    return status.replace("_", " "), _ERP_COLOUR.get(status, NEUTRAL), None


def bank_view(result: dict) -> tuple[str, str, str | None]:
    lines = result.get("lines") or []
    if not lines:
        return "no lines", NOTHING, None
    credits = [line["amount"] for line in lines if line["amount"] > 0]
    debits = [-line["amount"] for line in lines if line["amount"] < 0]
    parts = []
    for name, amounts in (("credits", credits), ("debits", debits)):
        if amounts:
            parts.append(f"{name} {usd(sum(amounts))}"
                         + (f" ({len(amounts)} lines)" if len(amounts) > 1 else ""))
    colour = PAID if sum(credits) > sum(debits) else RETURNED if debits else NOTHING
    return " · ".join(parts), colour, None


_VIEWS = {"read_processor": processor_view, "read_ledger": ledger_view, "read_erp": erp_view,
          "read_bank": bank_view}


def probe_view(result: dict) -> tuple[str, str]:
    if "error" in result:
        return "probe refused", FAILED
    captures = result.get("captures") or {}
    if not captures:
        return "probe: no capture yet", NOTHING
    text = ", ".join(f"{op} {answer}" for op, answer in captures.items())
    return f"probe: {text}", _STATUS_COLOUR.get(captures.get("cap1", "unknown"), NEUTRAL)


# ----------------------------------------------------------------- the two views
class PublicView(NamedTuple):
    """Only what the agent was told: the brief's order value and probe arm, the clock, the calls
    and their results."""

    order_value: int
    probe: str
    now: int
    calls_used: int
    history: tuple


class TruthView(NamedTuple):
    """Only for an ended case: the canonical log, t_det and the episode's record."""

    log: tuple
    t_det: int
    rec: object  # finality_gym.EpisodeRecord


def _public_view(episode) -> PublicView:
    return PublicView(episode.task.order_value, episode.probe, episode.now, episode.calls_used,
                      tuple(episode.history))


def _truth_view(episode) -> TruthView | None:
    if not episode.done:
        return None
    return TruthView(tuple(episode.world.log), episode.task.t_det, episode.record())


# ----------------------------------------------------------------- label placement
class _Rows:
    """Greedy placement of left-aligned labels in a few rows, in time order: a label takes the
    first row where it does not overlap the previous one, or moves right (a leader joins it to
    its mark); with neither it is left out (the mark and the band still show)."""

    def __init__(self, ys: list[float]):
        self.ys = ys
        self.ends = [-1e9] * len(ys)

    def place(self, x: float, width: float, gap: float = 6,
              shift: float = 0) -> tuple[float, float] | None:
        x = min(x, WIDTH - 6 - width)
        for i, end in enumerate(self.ends):
            if x >= end + gap:
                self.ends[i] = x + width
                return x, self.ys[i]
        i = min(range(len(self.ends)), key=lambda k: self.ends[k])
        moved = self.ends[i] + gap
        if moved - x <= shift and moved + width <= WIDTH - 6:
            self.ends[i] = moved + width
            return moved, self.ys[i]
        return None


# ----------------------------------------------------------------- drawing
class _Canvas:
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
            w = _width(text, size, kwargs.get("weight") == "bold")
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


def _rgba(canvas: _Canvas, background: np.ndarray | None = None) -> np.ndarray:
    """The canvas drawn by Agg over `background` (RGBA), as a new RGBA array."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI, facecolor="white")
    agg = FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(HEIGHT, 0)
    ax.set_axis_off()  # and with it the axes' own background: the layer below shows
    canvas.render(ax)
    renderer = agg.get_renderer()
    renderer.clear()
    if background is not None:  # start from the shared layer instead of a blank page
        np.asarray(agg.buffer_rgba())[...] = background
        fig.patch.set_visible(False)
    fig.draw(renderer)
    image = np.array(agg.buffer_rgba(), dtype=np.uint8)
    assert image.shape == (HEIGHT, WIDTH, 4), image.shape
    return image


@lru_cache(maxsize=1)
def _background() -> np.ndarray:
    """The layer every frame shares (constants only), drawn once per process."""
    canvas = _Canvas()
    _static(canvas)
    image = _rgba(canvas)
    image.flags.writeable = False
    return image


def draw(episode) -> np.ndarray:
    """The timeline of `episode` so far, as an RGB `uint8` array of shape `FRAME_SHAPE`;
    `None` (an env not reset) gives the empty timeline."""
    return np.ascontiguousarray(_rgba(_compose(episode), _background())[..., :3])


def texts(episode) -> list[str]:
    """Every text `draw(episode)` writes into the image, the shared layer's included (for tests
    and checks: what the picture says, without reading pixels)."""
    static = _Canvas()
    _static(static)
    return [text for _, _, text, _ in static.texts + _compose(episode).texts]


def _compose(episode) -> _Canvas:
    """What is particular to this frame, over the shared layer."""
    canvas = _Canvas()
    _lines_over_bands(canvas)
    if episode is None:
        canvas.text(10, HEADER_Y + 10, "finality-gym: no case yet (call reset())", fontsize=13,
                    weight="bold")
        return canvas
    public = _public_view(episode)
    truth = _truth_view(episode)
    _header(canvas, public, truth)
    _marks(canvas, public, truth)
    _truth_track(canvas, truth)
    for tool, _, _, (top, _), _ in _SYSTEMS:
        _system_track(canvas, public, truth, tool, top)
    _calls_track(canvas, public, truth)
    _footer(canvas, truth)
    return canvas


# ----------------------------------------------------------------- the shared layer
def _static(c: _Canvas) -> None:
    top, bottom = TRUTH[0], CALLS[0] + CALLS[1]
    split = x_of(SHIP_BY)
    c.rect(split, top, X1 - split, bottom - top, "#f1f3f5", z=0)  # after the deadline
    for track_top, height in (TRUTH, PROCESSOR, LEDGER, ERP, BANK, CALLS):
        y = track_top + height + 3
        c.line(8, y, X1, y, "#dee2e6", 0.8, z=0.5)
    for t in (200, 300, 400, 500, 900, 1200, 1500):
        c.line(x_of(t), top, x_of(t), bottom, "#e9ecef", 0.6, z=0.5)
    # track names
    for name, what, track_top in (("truth", "the canonical log", TRUTH[0]),
                                  *((n, w, tr[0]) for _, n, _, tr, w in _SYSTEMS),
                                  ("agent calls", "", CALLS[0])):
        c.text(10, track_top + 14, name, fontsize=10, weight="bold")
        if what:
            c.text(10, track_top + 30, what, fontsize=7.5, color=FAINT)
    for y, what in ((CALLS[0] + 64, "reads"), (CALLS[0] + 84, "probes, retries, end"),
                    (CALLS[0] + 104, "waits")):
        c.text(X0 - 8, y, what, ha="right", fontsize=7, color=FAINT)
        c.line(X0, y, X1, y, "#e9ecef", 0.6, z=0.5)
    # the axis
    c.line(X0, AXIS_Y - 10, X1, AXIS_Y - 10, NEUTRAL, 0.8)
    for t in (120, 200, 300, 400, 500, 600, 900, 1200, 1500, 1800):
        x = x_of(t)
        c.line(x, AXIS_Y - 10, x, AXIS_Y - 6, NEUTRAL, 0.8)
        c.text(x, AXIS_Y + 1, str(t), ha="center", fontsize=8)
    for t, name in ((HANDOVER_AT, "hand-over"), (SHIP_BY, "ship-by deadline"),
                    (HORIZON, "horizon")):
        c.text(x_of(t), AXIS_Y + 14, name, ha="center" if t != HORIZON else "right",
               fontsize=7.5, weight="bold")
    c.text(X0 - 18, AXIS_Y + 1, "t (ticks = s)", ha="right", fontsize=8, color=FAINT)
    c.text(x_of(1200), AXIS_Y + 14, "(scale compressed 4.5x after the deadline)",
           ha="center", fontsize=7, color=FAINT)
    # the legend
    lx, ly = 830, FOOTER_Y - 4
    c.text(lx, ly, "colours: what a system showed, or the truth", fontsize=7.5, color=FAINT)
    for i, (colour, label) in enumerate(LEGEND):
        col, row = divmod(i, 3)
        x, y = lx + col * 220, ly + 16 + row * 17
        c.rect(x, y - 5, 22, 10, colour)
        c.text(x + 28, y, label, fontsize=7.5)
    c.line(lx, ly + 70, lx + 22, ly + 70, TDET, 1.6, "dashed")
    c.text(lx + 28, ly + 70, "t_det (shown once ended)", fontsize=7.5)
    c.line(lx + 220, ly + 70, lx + 242, ly + 70, SHIPPED, 1.6)
    c.text(lx + 248, ly + 70, "now (while running)", fontsize=7.5)
    c.text(lx, ly + 88, "marks: | a read   \u25c6 probe   \u25b2 retry   \u25a0 disposition   "
           "\u25bc true event", fontsize=7, color=FAINT)


def _lines_over_bands(c: _Canvas) -> None:
    """The hand-over, the deadline and the horizon, drawn over the bands of each frame."""
    top, bottom = TRUTH[0] - 4, CALLS[0] + CALLS[1] + 4
    for t in (HANDOVER_AT, SHIP_BY, HORIZON):
        c.line(x_of(t), top, x_of(t), bottom, "#495057", 1.2,
               "dashed" if t == SHIP_BY else "solid")


# ----------------------------------------------------------------- this frame
def _header(c: _Canvas, pub: PublicView, truth: TruthView | None) -> None:
    c.text(10, HEADER_Y + 10, f"Order of {usd(pub.order_value)} paid by card: is the payment "
           "final?", fontsize=13, weight="bold")
    c.text(10, HEADER_Y + 32, f"capture cap1 submitted at t={CAPTURE_SUBMITTED_AT} under its "
           f"idempotency key · the agent takes over at t={HANDOVER_AT} · ship by t={SHIP_BY} · "
           f"the world runs to t={HORIZON} · probe arm: {pub.probe}", fontsize=9)
    if truth is None:
        c.text(10, HEADER_Y + 52, f"t={pub.now} · {pub.calls_used} of {CALL_BUDGET} calls used · "
               "the case is open: what really happened and the outcome stay hidden until it "
               "ends", fontsize=9, color=SHIPPED, weight="bold")
        return
    how = ("lapsed: closed when the budget or the horizon ran out" if truth.rec.lapsed
           else f"by {truth.rec.disposition}")
    c.text(10, HEADER_Y + 52, f"ENDED at t={truth.rec.end_t} {how} · {pub.calls_used} of "
           f"{CALL_BUDGET} calls used", fontsize=9, weight="bold")
    c.text(WIDTH - 12, HEADER_Y + 14, f"gap {usd(truth.rec.gap)}", fontsize=15, weight="bold",
           ha="right", color=_gap_colour(truth.rec.gap))
    c.text(WIDTH - 12, HEADER_Y + 38, f"position {usd(truth.rec.position)} · reference "
           f"{usd(truth.rec.reference)}", fontsize=9, ha="right")


def _gap_colour(gap: int) -> str:
    return PAID if gap == 0 else FAILED if gap > 0 else SHIPPED


def _marks(c: _Canvas, pub: PublicView, truth: TruthView | None) -> None:
    """The vertical lines of the moment: now (running) or the end, and t_det once ended."""
    top, bottom = TRUTH[0] - 4, CALLS[0] + CALLS[1] + 4
    rows = _Rows(list(MARKS_Y))
    if truth is None:
        items = [(pub.now, f"now t={pub.now}", SHIPPED, "solid")]
    else:
        label = f"t_det={truth.t_det}: cap1's outcome determined"
        if truth.t_det < HANDOVER_AT:
            label = f"t_det={truth.t_det} (before hand-over): cap1's outcome determined"
        items = sorted([(truth.rec.end_t, f"agent's end t={truth.rec.end_t}", NEUTRAL, "solid"),
                        (truth.t_det, label, TDET, "dashed")])
    for t, label, colour, style in items:
        x = x_of(t)
        if HANDOVER_AT <= t <= HORIZON:
            c.line(x, top, x, bottom, colour, 1.6, style)
        spot = rows.place(x - 3, _width(label, bold=True)) or (x - 3, MARKS_Y[-1])
        c.text(spot[0], spot[1], label, box=True, color=colour, weight="bold")


def _label(c: _Canvas, rows: _Rows, x: float, anchor_y: float, text: str,
           shift: float = 160, **kwargs) -> None:
    """A label for a mark at column x: in the first free row, or moved right with a leader."""
    width = _width(text, kwargs.get("fontsize", FONT), kwargs.get("weight") == "bold")
    spot = rows.place(x - 3, width, shift=shift)
    if spot is None:
        return
    lx, ly = spot
    if lx > x + 2:  # moved: a leader from the mark to the label
        c.line(x, anchor_y, lx - 1, ly, "#adb5bd", 0.6, z=2.5)
    else:
        c.line(x, ly + 5, x, anchor_y, "#dee2e6", 0.6, z=0.6)
    c.text(lx, ly, text, box=True, **kwargs)


def _band(c: _Canvas, x0: float, x1: float, y: float, h: float, colour: str,
          newest: str | None) -> None:
    x1 = max(x1, x0 + 1)
    if newest is None:
        c.rect(x0, y, x1 - x0, h, colour)
    else:  # another capture exists: a thin strip of its status above cap1's
        c.rect(x0, y, x1 - x0, h / 3, newest)
        c.rect(x0, y + h / 3 + 1, x1 - x0, 2 * h / 3 - 1, colour)


def _label_rows(top: float) -> _Rows:
    return _Rows([top + 10, top + 10 + ROW, top + 10 + 2 * ROW])


def _system_track(c: _Canvas, pub: PublicView, truth: TruthView | None, tool: str,
                  top: float) -> None:
    reads = [(t, result) for t, called, _, result in pub.history if called == tool]
    band_y, band_h = top + 46, 18
    if not reads:
        c.text(X0 + 6, band_y + band_h / 2, "never read", color=FAINT, style="italic")
        return
    rows = _label_rows(top)
    until = pub.now if truth is None else truth.rec.end_t
    view = _VIEWS[tool]
    previous = None
    for i, (t, result) in enumerate(reads):
        label, colour, newest = view(result)
        end = reads[i + 1][0] if i + 1 < len(reads) else until
        _band(c, x_of(t), x_of(end), band_y, band_h, colour, newest)
        c.line(x_of(t), band_y - 3, x_of(t), band_y + band_h + 3, NEUTRAL, 1.0)
        if label != previous:  # a label where the view changed; the band says the rest
            _label(c, rows, x_of(t), band_y - 3, f"t={t} {label}",
                   color=colour if colour != NOTHING else FAINT)
            previous = label


def _calls_track(c: _Canvas, pub: PublicView, truth: TruthView | None) -> None:
    top = CALLS[0]
    reads_y, acts_y, waits_y = top + 64, top + 84, top + 104
    rows = _label_rows(top)
    # reads: a tick each, and their systems' letters (a run of close reads shares one label)
    runs: list[list] = []
    for t, tool, _, _ in pub.history:
        if tool in _LETTER:
            x = x_of(t)
            c.line(x, reads_y - 4, x, reads_y + 4, NEUTRAL, 1.0)
            if runs and x - runs[-1][1] < 8:
                runs[-1][1] = x
                runs[-1][2] += _LETTER[tool]
            else:
                runs.append([x, x, _LETTER[tool]])
    letters = _Rows([reads_y - 10])
    for x, _, text in runs:
        spot = letters.place(x - 2, _width(text, 6.5), gap=2)
        if spot is not None:
            c.text(spot[0], spot[1], text, fontsize=6.5)
    for t, tool, args, result in pub.history:
        x = x_of(t)
        if tool in _LETTER:
            continue
        if tool == "wait":
            ticks = result.get("ticks", args.get("ticks", 0))
            x1 = x_of(t + ticks)
            c.rect(x, waits_y - 5, max(x1 - x, 1.5), 10, "#adb5bd")
            label = f"wait {ticks}"
            if x1 - x > _width(label, 6.5) + 4:
                c.text((x + x1) / 2, waits_y, label, ha="center", fontsize=6.5, color="white")
            continue
        final = False
        if tool == "probe_processor":
            label, colour = probe_view(result)
            if pub.probe == "delayed" and "error" not in result:
                label = label.replace("probe:", f"probe (as of t={t - PROBE_DELAY}):", 1)
            marker, size = ("X", 40) if "error" in result else ("D", 34)
        elif tool == "retry_capture":
            fresh = args.get("key") == "fresh"
            label = ("retry with a FRESH key: a new capture (2nd charge)" if fresh
                     else "retry cap1 with its original key")
            colour, marker, size = (FAILED if fresh else RETRY), "^", 50
        elif "error" in result:
            label, colour, marker, size = f"{tool} refused (after the deadline)", FAILED, "X", 50
        else:
            label, colour, marker, size = _DISPOSITION_LABEL.get(tool, tool), NEUTRAL, "s", 70
            final = True
        c.mark(x, acts_y, colour, marker, size)
        _label(c, rows, x, acts_y - 6, f"t={t} {label}", color=colour,
               weight="bold" if final else "normal")
    if truth is not None and truth.rec.lapsed:
        x = x_of(truth.rec.end_t)
        c.mark(x, acts_y, NEUTRAL, "s", 70)
        _label(c, rows, x, acts_y - 6, f"t={truth.rec.end_t} LAPSED (closed: budget or horizon "
               "spent)", weight="bold")


# ----------------------------------------------------------------- the truth (once ended)
_EVENT_COLOUR = {"capture_submitted": PENDING, "capture_settled": PAID,
                 "capture_failed": FAILED, "refunded": RETURNED, "capture_voided": RETURNED,
                 "chargeback": RETURNED, "shipped": SHIPPED}
_TRUE_STATUS = {"capture_submitted": "submitted", "capture_settled": "settled",
                "capture_failed": "failed", "refunded": "refunded", "capture_voided": "voided",
                "chargeback": "charged_back"}


def _event_label(event) -> str:
    kind, op = event.kind, event.op
    attempt = (event.attrs or {}).get("attempt", 1)
    who = op if attempt == 1 else f"{op} #{attempt}"
    if kind == "capture_submitted":
        return (f"{op} retried (attempt {attempt})" if op == "cap1"
                else f"{op} submitted: a 2nd charge")
    if kind == "capture_settled":
        return f"{who} settled {usd(event.amount, sign=True)}"
    if kind == "capture_failed":
        return f"{who} declined ({event.attrs['decline']})"
    if kind == "refunded":
        return f"{who} refunded {usd(-event.amount)}"
    if kind == "capture_voided":
        return f"{who} voided"
    if kind == "chargeback":
        return f"chargeback on {op} {usd(-event.amount)}"
    return {"shipped": "goods shipped", "escalated": "escalated to a specialist",
            "closed": "closed", "written_off": "written off"}.get(kind, kind)


def _truth_track(c: _Canvas, truth: TruthView | None) -> None:
    top, height = TRUTH
    band_y, band_h = top + 50, 18
    if truth is None:
        x0, x1 = X0 + 2, X1 - 2
        c.rect(x0, top + 6, x1 - x0, height - 12, "#f8f9fa", z=0.7)
        for x in range(int(x0), int(x1) - 10, 14):
            c.line(x, top + 6, x + 10, top + height - 6, "#e9ecef", 0.8, z=0.8)
        label = "truth: hidden until the case ends"
        left = (x0 + x1 - _width(label, 12, bold=True)) / 2
        c.text(left, top + height / 2, label, box=True, fontsize=12, color=FAINT,
               weight="bold")
        return
    end_x = x_of(truth.rec.end_t)
    c.rect(end_x, top + 4, X1 - end_x, height - 8, (0.906, 0.961, 1.0, 0.8), z=0.7)
    c.text(X1 - 4, top + height - 10, "after the agent's end the world runs on to the horizon",
           ha="right", fontsize=6.5, color=FAINT)
    # each capture's true status, from the log
    status: dict = {}
    changes: list = []
    for event in truth.log:
        new = _TRUE_STATUS.get(event.kind)
        if new is not None and event.op is not None:
            status[event.op] = new
            changes.append((event.t, dict(status)))
    for i, (t, state) in enumerate(changes):
        end = changes[i + 1][0] if i + 1 < len(changes) else HORIZON
        if end < HANDOVER_AT:
            continue
        others = [op for op in state if op != "cap1"]
        _band(c, x_of(t), x_of(end), band_y, band_h,
              _STATUS_COLOUR.get(state.get("cap1"), NOTHING),
              _STATUS_COLOUR.get(state[others[-1]], NOTHING) if others else None)
    if any(op != "cap1" for op in status):
        c.text(X0 - 4, band_y + band_h / 6, "cap2+", ha="right", fontsize=6, color=FAINT)
        c.text(X0 - 4, band_y + band_h * 2 / 3, "cap1", ha="right", fontsize=6, color=FAINT)
    rows = _label_rows(top)
    specialist_at = (truth.rec.end_t + ESCALATION_DELAY if truth.rec.disposition == "escalate"
                     else None)
    for event in truth.log:
        if event.seq < 3 and event.t < HANDOVER_AT:
            continue  # order placed, authorized, cap1 submitted: the header states them
        x = x_of(event.t)
        colour = _EVENT_COLOUR.get(event.kind, NEUTRAL)
        c.mark(x, band_y + band_h / 2, colour, "v" if event.op else "o", 42)
        label = f"t={event.t} {_event_label(event)}"
        if event.t < HANDOVER_AT:
            label += " (before hand-over)"
        if event.t == specialist_at and event.kind in ("shipped", "refunded", "capture_voided"):
            label += " (specialist)"
        _label(c, rows, x, band_y - 2, label, shift=240, color=colour)


def _footer(c: _Canvas, truth: TruthView | None) -> None:
    y = FOOTER_Y
    c.rect(8, y - 10, 800, HEIGHT - y + 6, "#f8f9fa", z=0.7)
    if truth is None:
        c.text(20, y + 12, "outcome: hidden until the case ends", fontsize=11, color=FAINT,
               weight="bold")
        c.text(20, y + 36, "(the disposition, the position, the reference and the gap appear "
               "once the agent disposes of the case or it lapses)", fontsize=8, color=FAINT)
        return
    how = ("lapsed: closed when the budget or the horizon ran out" if truth.rec.lapsed
           else f"{truth.rec.disposition} at t={truth.rec.end_t}")
    c.text(20, y + 8, f"outcome: {how}", fontsize=11, weight="bold")
    c.text(20, y + 30, f"position {usd(truth.rec.position)} = cash kept {usd(truth.rec.cash)} − cost of "
           f"goods {usd(truth.rec.cogs)} − liability {usd(truth.rec.liability)} − dispute fee "
           f"{usd(truth.rec.dispute)} − escalation fee {usd(truth.rec.escalation)}", fontsize=8.5)
    c.text(20, y + 50, f"reference {usd(truth.rec.reference)} (what was possible knowing only when "
           "and how cap1 resolves)", fontsize=8.5)
    c.text(20, y + 72, f"gap {usd(truth.rec.gap)} (excess loss = reference − position) · goods "
           f"left: {'yes' if truth.rec.goods_left else 'no'} · escalated: "
           f"{'yes' if truth.rec.escalated else 'no'}", fontsize=9, weight="bold",
           color=_gap_colour(truth.rec.gap))
