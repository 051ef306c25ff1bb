"""The `rgb_array` rendering of an episode: one timeline image of the case so far.

`draw(episode)` returns a `uint8` array of shape `FRAME_SHAPE` (800 x 1280 RGB), the same for
every episode and step. The x axis is the clock from the hand-over (t=120) to the horizon
(t=1800), wider up to the ship-by deadline (t=600), where nearly every call falls. Tracks, top
to bottom:

- truth: the canonical log (`docs/world.md` section 2) and `t_det`, drawn only once the case
  has ended; while it runs the track is an empty box saying so;
- processor, ledger, ERP, bank: at every read the agent made, what the system showed (a band
  coloured by what the view means, from that read to the next, and a label where it changed);
  once the case has ended, a star at each delivery or read a profile fault changed, labelled
  with the fault (lost, delayed, duplicated, reordered, half-committed, stale read);
- agent calls: reads, probes with their answer, waits as spans, retries with their key, refused
  calls and the disposition; a run of identical calls shares one label ("... x6");
- below: the outcome (disposition, position, reference, gap) once the case has ended.

What the picture may show is split in two: `_public_view` reads only what the agent was told
(the order value, the probe arm, the clock, the calls and their results), and `_truth_view` runs
only for an ended episode: the canonical log, `t_det`, the record and the fault marks are all
ground truth. So while a case runs, the two halves of a twin pair render the same image byte
for byte before `t_det`, and no frame ever names the task, its archetype, its fate or its twin
half.

Labels are placed in rows (`_Rows`) so that no two texts overlap; `text_boxes` measures what
Agg draws, for the tests that hold the picture to it.

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
from .faults import FAMILIES, FaultProfile
from .replicas import BANK, BANK_BATCH, ERP, LEDGER, PROCESSOR, Replicas
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
_STATUS_COLOUR = {"submitted": PENDING, "unknown": PENDING, "settled": PAID, "failed": FAILED,
                  "failed_soft": FAILED, "failed_hard": FAILED, "refunded": RETURNED,
                  "voided": RETURNED, "charged_back": RETURNED}
_ERP_COLOUR = {"placed": PENDING, "authorized": PENDING, "payment_pending": PENDING,
               "paid": PAID, "payment_failed": FAILED, "shipped": SHIPPED,
               "refunded": RETURNED, "disputed": RETURNED}
# (tool, track name, letter, (top, height), what the label shows)
_SYSTEMS = (("read_processor", "processor", "P", PROCESSOR_TRACK, "capture status"),
            ("read_ledger", "ledger", "L", LEDGER_TRACK, "cash · clearing"),
            ("read_erp", "ERP", "E", ERP_TRACK, "order status"),
            ("read_bank", "bank", "B", BANK_TRACK, "statement lines"))
_LETTER = {tool: letter for tool, _, letter, _, _ in _SYSTEMS}
_SYSTEM_OF = {"read_processor": PROCESSOR, "read_ledger": LEDGER, "read_erp": ERP,
              "read_bank": BANK}
# what a fault did to the delivery or read it marks, by family: the word its label starts with
FAULT_WORDS = {"loss": "lost", "delay": "delayed", "duplicate": "duplicated",
               "partial_commit": "half-committed", "reorder": "reordered",
               "stale_read": "stale read"}
assert tuple(FAULT_WORDS) == FAMILIES
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


_ADVANCES: dict[tuple[float, bool, str], float] = {}  # font metrics only: no episode's data


def _width(text: str, size: float = FONT, bold: bool = False) -> float:
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
    if len(others) > 2:  # many fresh captures: counted, or the label would not fit
        counts: dict[str, int] = {}
        for op in others:
            counts[op["status"]] = counts.get(op["status"], 0) + 1
        parts = parts[:1] if first is not None else []
        parts.append(f"{len(others)} other captures: "
                     + ", ".join(f"{n} {status}" for status, n in counts.items()))
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


class FaultMark(NamedTuple):
    """One delivery or read a profile fault changed, for the track of the system `tool` reads.
    `t` is when the system would have shown the delivery (a bank line: when it would have
    posted) or the read's time; `moved_to`, for a delayed or reordered delivery, when it showed
    instead; `what` the event delivered ("" for a read)."""

    tool: str
    family: str
    t: int
    moved_to: int | None
    what: str


class TruthView(NamedTuple):
    """Only for an ended case: the canonical log, t_det, the episode's record and the faults."""

    log: tuple
    t_det: int
    rec: object  # finality_gym.EpisodeRecord
    faults: tuple  # FaultMark, in time order


def _public_view(episode) -> PublicView:
    return PublicView(episode.task.order_value, episode.probe, episode.now, episode.calls_used,
                      tuple(episode.history))


def _truth_view(episode) -> TruthView | None:
    if not episode.done:
        return None
    return TruthView(tuple(episode.world.log), episode.task.t_det, episode.record(),
                     fault_marks(episode))


# ----------------------------------------------------------------- the faults (once ended)
def fault_marks(episode) -> tuple[FaultMark, ...]:
    """The deliveries and reads the episode's fault profile changed, in time order: exactly the
    firings its record's `fault_firings` counts (a reorder swaps two deliveries: two marks).

    Found by replaying the replicas of the ended episode (every draw is a pure function of the
    episode key and an identity, docs/world.md section 4) three times and comparing: under the
    episode's profile, its reads in their order (so each stale read shows as a firing); without
    `reorder` (the arrivals before any swap); and with no profile fault (what the world and the
    case's own archetype faults deliver, which are not marked). Each system's deliveries are
    built up to the agent's last read of it, as the episode built them. Only for an ended
    episode: what a fault did is ground truth."""
    if not episode.done:
        raise ValueError("fault marks are ground truth: only for an ended episode")
    world, task, seed, profile = episode.world, episode.task, episode.seed, episode.faults
    actual = Replicas(world, task, seed, profile)
    unswapped = Replicas(world, task, seed, profile.without("reorder"))
    clean = Replicas(world, task, seed, FaultProfile.none())
    marks = []
    last_read: dict[str, int] = {}
    for ordinal, (t, tool, _, _) in enumerate(episode.history):
        if tool in _SYSTEM_OF:
            stale = actual.fault_firings()["stale_read"]
            actual.read(_SYSTEM_OF[tool], t, ordinal)
            if actual.fault_firings()["stale_read"] > stale:
                marks.append(FaultMark(tool, "stale_read", t, None, ""))
            last_read[tool] = t
    for tool, t in last_read.items():
        system = _SYSTEM_OF[tool]
        unswapped.sync(system, t)
        clean.sync(system, t)
        marks += _delivery_faults(tool, *(_by_copy(r.deliveries[system])
                                          for r in (actual, unswapped, clean)))
    return tuple(sorted(marks, key=lambda m: (m.t, m.tool, m.family)))


def _by_copy(deliveries: list) -> dict:
    """A system's deliveries by (event seq, copy)."""
    return {(d[1], d[2]): d for d in deliveries}


def _delivery_faults(tool: str, actual: dict, unswapped: dict, clean: dict) -> list[FaultMark]:
    """What the profile changed among one system's deliveries (`_by_copy` of each replay)."""
    shown = ((lambda arrival: (arrival // BANK_BATCH + 1) * BANK_BATCH) if tool == "read_bank"
             else (lambda arrival: arrival))
    marks = []
    for key, d in clean.items():
        what = _delivered(d[3])
        if key[1] == 0 and key not in actual:
            marks.append(FaultMark(tool, "loss", shown(d[0]), None, what))
        elif key[1] == 0 and unswapped[key][0] != d[0]:
            marks.append(FaultMark(tool, "delay", shown(d[0]), shown(unswapped[key][0]), what))
    for key, d in actual.items():
        what = _delivered(d[3])
        if key not in clean:
            marks.append(FaultMark(tool, "duplicate", shown(d[0]), None, what))
        elif d[4] and not clean[key][4]:
            marks.append(FaultMark(tool, "partial_commit", shown(d[0]), None, what))
        if key[1] == 0 and d[0] != unswapped[key][0]:
            marks.append(FaultMark(tool, "reorder", shown(unswapped[key][0]), shown(d[0]), what))
    return marks


_DELIVERED = {"order_placed": "order placed", "authorized": "authorized", "shipped": "shipped",
              "capture_submitted": "submitted", "capture_settled": "settled",
              "capture_failed": "declined", "refunded": "refunded", "capture_voided": "voided",
              "chargeback": "chargeback"}


def _delivered(event) -> str:
    """An event as a fault's label names it: the operation (and attempt) and what happened."""
    if event.op is None:
        return _DELIVERED[event.kind]
    attempt = (event.attrs or {}).get("attempt", 1)
    return f"{event.op if attempt == 1 else f'{event.op} #{attempt}'} {_DELIVERED[event.kind]}"


# ----------------------------------------------------------------- label placement
class _Rows:
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


def _figure(*canvases: _Canvas):
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


def _rgba(canvas: _Canvas, background: np.ndarray | None = None) -> np.ndarray:
    """The canvas drawn by Agg over `background` (RGBA), as a new RGBA array."""
    fig, _, agg = _figure(canvas)
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


def text_boxes(episode) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Every text `draw(episode)` writes, the shared layer's included, with the box Agg draws it
    in: (text, (x0, y0, x1, y1)) in display pixels, y up (for tests and checks: that no two
    texts overlap, measured rather than estimated as `_width` does)."""
    static = _Canvas()
    _static(static)
    _, ax, agg = _figure(static, _compose(episode))
    renderer = agg.get_renderer()
    return [(text.get_text(), tuple(text.get_window_extent(renderer).extents))
            for text in ax.texts]


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
    _legend_line(canvas, truth)
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
    for track_top, height in (TRUTH, PROCESSOR_TRACK, LEDGER_TRACK, ERP_TRACK, BANK_TRACK,
                              CALLS):
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
    # the legend (the "now" or "agent's end" entry is the frame's: see _legend_line)
    lx, ly = LEGEND_X, LEGEND_Y
    c.text(lx, ly, "colours: what a system showed, or the truth", fontsize=7.5, color=FAINT)
    for i, (colour, label) in enumerate(LEGEND):
        col, row = divmod(i, 3)
        x, y = lx + col * 220, ly + 15 + row * 15
        c.rect(x, y - 5, 22, 10, colour)
        c.text(x + 28, y, label, fontsize=7.5)
    c.line(lx, ly + 62, lx + 22, ly + 62, TDET, 1.6, "dashed")
    c.text(lx + 28, ly + 62, "t_det (shown once ended)", fontsize=7.5)
    c.text(lx, ly + 79, "marks: | a read   \u25c6 probe   \u25b2 retry   \u25a0 disposition   "
           "\u25bc true event", fontsize=7, color=FAINT)
    c.mark(lx + 11, ly + 96, FAULT, "*", 80)
    c.text(lx + 28, ly + 96, "a fault changed this delivery or read (shown once ended)",
           fontsize=7.5)


def _legend_line(c: _Canvas, truth: TruthView | None) -> None:
    """The legend entry of the frame's solid vertical line: "now" while the case runs, the
    agent's end once it has ended."""
    x, y = LEGEND_X + 220, LEGEND_Y + 62
    colour, label = (SHIPPED, "now (while running)") if truth is None else (NEUTRAL,
                                                                           "agent's end")
    c.line(x, y, x + 22, y, colour, 1.6)
    c.text(x + 28, y, label, fontsize=7.5)


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
    c.text(WIDTH - 12, HEADER_Y + 52, f"position {usd(truth.rec.position)} · reference "
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
           shift: float = 160, **kwargs) -> bool:
    """A label for a mark at column x: in the first free row, or moved right with a leader.
    False if there was no room (the label is left out)."""
    width = _width(text, kwargs.get("fontsize", FONT), kwargs.get("weight") == "bold")
    spot = rows.place(x - 3, width, shift=shift)
    if spot is None:
        return False
    lx, ly = spot
    if lx > x + 2:  # moved: a leader from the mark to the label
        c.line(x, anchor_y, lx - 1, ly, "#adb5bd", 0.6, z=2.5)
    else:
        c.line(x, ly + 5, x, anchor_y, "#dee2e6", 0.6, z=0.6)
    c.text(lx, ly, text, box=True, **kwargs)
    return True


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
    if not reads:  # and so no faults either: a system's deliveries are built by its reads
        c.text(X0 + 6, band_y + band_h / 2, "never read", color=FAINT, style="italic")
        return
    until = pub.now if truth is None else truth.rec.end_t
    view = _VIEWS[tool]
    labels = []  # (0 for a read or 1 for a fault, x, text, short text, colour), in that order
    previous = None
    for i, (t, result) in enumerate(reads):
        label, colour, newest = view(result)
        end = reads[i + 1][0] if i + 1 < len(reads) else until
        _band(c, x_of(t), x_of(end), band_y, band_h, colour, newest)
        c.line(x_of(t), band_y - 3, x_of(t), band_y + band_h + 3, NEUTRAL, 1.0)
        if label != previous:  # a label where the view changed; the band says the rest
            labels.append((0, x_of(t), f"t={t} {label}", None,
                           colour if colour != NOTHING else FAINT))
            previous = label
    for mark in () if truth is None else (m for m in truth.faults if m.tool == tool):
        labels.append((1, x_of(mark.t), _fault(c, mark, band_y, band_h),
                       FAULT_WORDS[mark.family], FAULT))
    rows = _label_rows(top)
    for _, x, text, short, colour in sorted(labels, key=lambda label: label[:2]):
        placed = _label(c, rows, x, band_y - 3, text, shift=160 if short is None else 240,
                        color=colour)
        if not placed and short is not None:  # a fault is at least named
            _label(c, rows, x, band_y - 3, short, shift=400, color=colour)


def _fault(c: _Canvas, mark: FaultMark, band_y: float, band_h: float) -> str:
    """A fault's star on the band where the system would have shown the delivery (or at the
    read), a dotted line under the band to where a moved delivery showed instead; its label."""
    x = x_of(mark.t)
    c.mark(x, band_y + band_h / 2, FAULT, "*", 80)
    word = FAULT_WORDS[mark.family]
    if mark.moved_to is None:
        return f"t={mark.t} {word}" + (f": {mark.what}" if mark.what else "")
    to, y = x_of(mark.moved_to), band_y + band_h + 3
    c.line(x, y, to, y, FAULT, 0.8, "dotted", z=2.6)
    c.mark(to, y, FAULT, ">" if mark.moved_to > mark.t else "<", 14)
    return f"t={mark.t} {word} to t={mark.moved_to}: {mark.what}"


def _calls_track(c: _Canvas, pub: PublicView, truth: TruthView | None) -> None:
    top = CALLS[0]
    reads_y, acts_y, waits_y = top + 64, top + 84, top + 104
    rows = _label_rows(top)
    # reads: a tick each, and their systems' letters (a run of close reads shares one label)
    groups: list[list] = []
    for t, tool, _, _ in pub.history:
        if tool in _LETTER:
            x = x_of(t)
            c.line(x, reads_y - 4, x, reads_y + 4, NEUTRAL, 1.0)
            if groups and x - groups[-1][1] < 8:
                groups[-1][1] = x
                groups[-1][2] += _LETTER[tool]
            else:
                groups.append([x, x, _LETTER[tool]])
    letters = _Rows([reads_y - 10])
    for x, _, text in groups:
        spot = letters.place(x - 2, _width(text, 6.5), gap=2)
        if spot is not None:
            c.text(spot[0], spot[1], text, fontsize=6.5)
    runs = []  # [first t, last t, count, label, colour, final, first capture]: a label a run
    captures = 1  # cap1, and one more for each fresh retry
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
            captures += fresh
            label = "retry with a FRESH key" if fresh else "retry cap1 with its original key"
            colour, marker, size = (FAILED if fresh else RETRY), "^", 50
        elif "error" in result:
            label, colour, marker, size = f"{tool} refused (after the deadline)", FAILED, "X", 50
        else:
            label, colour, marker, size = _DISPOSITION_LABEL.get(tool, tool), NEUTRAL, "s", 70
            final = True
        c.mark(x, acts_y, colour, marker, size)
        run = runs[-1] if runs else None
        if run is not None and run[3] == label and x - x_of(run[0]) < _width(f"t={t} {label}"):
            run[1], run[2] = t, run[2] + 1  # the same call again, under this run's label
        else:
            runs.append([t, t, 1, label, colour, final, captures])
    for first, last, count, label, colour, final, capture in runs:
        if label == "retry with a FRESH key":  # each one a new capture: another charge
            label += (f": new capture cap{capture} (charge #{capture})" if count == 1 else
                      f": new captures cap{capture}-cap{capture + count - 1} "
                      f"(charges #{capture}-#{capture + count - 1})")
        text = f"t={first} {label}" if count == 1 else f"t={first}-{last} {label} x{count}"
        _label(c, rows, x_of(first), acts_y - 6, text, color=colour,
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
                else f"{op} submitted: another charge")
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
    rec = truth.rec
    how = ("lapsed: closed when the budget or the horizon ran out" if rec.lapsed
           else f"{rec.disposition} at t={rec.end_t}")
    c.text(20, y + 8, f"outcome: {how}", fontsize=11, weight="bold")
    lines = ((y + 30, f"position {usd(rec.position)} = cash kept {usd(rec.cash)} − cost of goods "
              f"{usd(rec.cogs)} − liability {usd(rec.liability)} − dispute fee "
              f"{usd(rec.dispute)} − escalation fee {usd(rec.escalation)}", 8.5, {}),
             (y + 50, f"reference {usd(rec.reference)} (what was possible knowing only when and "
              "how cap1 resolves)", 8.5, {}),
             (y + 72, f"gap {usd(rec.gap)} (excess loss = reference − position) · goods "
              f"shipped: {'yes' if rec.goods_left else 'no'} · escalated: "
              f"{'yes' if rec.escalated else 'no'}", 9,
              {"weight": "bold", "color": _gap_colour(rec.gap)}))
    for line_y, text, size, kwargs in lines:  # smaller where large sums would reach the legend
        while size > 6 and _width(text, size, "weight" in kwargs) > FOOTER_WIDTH:
            size -= 0.5
        c.text(20, line_y, text, fontsize=size, **kwargs)
