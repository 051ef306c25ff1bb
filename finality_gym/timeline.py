"""The `rgb_array` rendering of an episode: one timeline image of the case so far.

`draw(episode)` returns a `uint8` array of shape `frame.FRAME_SHAPE` (800 x 1280 RGB), the same for
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

What the picture may show is split in two (`caseviews`): `public_view` reads only what the agent
was told (the order value, the probe arm, the clock, the calls and their results), and
`truth_view` runs only for an ended episode: the canonical log, `t_det`, the record and the fault
marks are all ground truth. So while a case runs, the two halves of a twin pair render the same image byte
for byte before `t_det`, and no frame ever names the task, its archetype, its fate or its twin
half.

This module composes a frame: the shared layer, the header, the vertical marks and the outcome
below, around the tracks (`tracks`), on the frame's canvas (`frame`). Labels are placed in rows
(`frame.Rows`) so that no two texts overlap; `text_boxes` measures what Agg draws, for the tests
that hold the picture to it.

matplotlib (Agg through `FigureCanvasAgg`: no pyplot, so no global figure state) is imported on
the first draw, so `finality_gym` imports without it. The layer that is the same in every frame
(grid, track names, axis, legend) is drawn once per process and cached; it holds nothing of any
episode.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .caseviews import PublicView, TruthView, public_view, truth_view
from .frame import (AXIS_Y, BANK_TRACK, CALLS, ERP_TRACK, FAILED, FAINT, FAULT, FOOTER_WIDTH,
                    FOOTER_Y, HEADER_Y, HEIGHT, LEDGER_TRACK, LEGEND, LEGEND_X, LEGEND_Y, MARKS_Y,
                    NEUTRAL, PAID, PROCESSOR_TRACK, SHIPPED, SYSTEMS, TDET, TRUTH, WIDTH, X0, X1,
                    Canvas, Rows, figure, rgba, text_width, usd, x_of)
from .tasks import CALL_BUDGET, CAPTURE_SUBMITTED_AT, HANDOVER_AT, HORIZON, SHIP_BY
from .tracks import calls_track, system_track, truth_track


@lru_cache(maxsize=1)
def _background() -> np.ndarray:
    """The layer every frame shares (constants only), drawn once per process."""
    canvas = Canvas()
    _static(canvas)
    image = rgba(canvas)
    image.flags.writeable = False
    return image


def draw(episode) -> np.ndarray:
    """The timeline of `episode` so far, as an RGB `uint8` array of shape
    `frame.FRAME_SHAPE`;
    `None` (an env not reset) gives the empty timeline."""
    return np.ascontiguousarray(rgba(_compose(episode), _background())[..., :3])


def texts(episode) -> list[str]:
    """Every text `draw(episode)` writes into the image, the shared layer's included (for tests
    and checks: what the picture says, without reading pixels)."""
    static = Canvas()
    _static(static)
    return [text for _, _, text, _ in static.texts + _compose(episode).texts]


def text_boxes(episode) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Every text `draw(episode)` writes, the shared layer's included, with the box Agg draws it
    in: (text, (x0, y0, x1, y1)) in display pixels, y up (for tests and checks: that no two
    texts overlap, measured rather than estimated as `frame.text_width` does)."""
    static = Canvas()
    _static(static)
    _, ax, agg = figure(static, _compose(episode))
    renderer = agg.get_renderer()
    return [(text.get_text(), tuple(text.get_window_extent(renderer).extents))
            for text in ax.texts]


def _compose(episode) -> Canvas:
    """What is particular to this frame, over the shared layer."""
    canvas = Canvas()
    _lines_over_bands(canvas)
    if episode is None:
        canvas.text(10, HEADER_Y + 10, "finality-gym: no case yet (call reset())", fontsize=13,
                    weight="bold")
        return canvas
    public = public_view(episode)
    truth = truth_view(episode)
    _header(canvas, public, truth)
    _legend_line(canvas, truth)
    _marks(canvas, public, truth)
    truth_track(canvas, truth)
    for tool, _, _, (top, _), _ in SYSTEMS:
        system_track(canvas, public, truth, tool, top)
    calls_track(canvas, public, truth)
    _footer(canvas, truth)
    return canvas


# ----------------------------------------------------------------- the shared layer
def _static(c: Canvas) -> None:
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
                                  *((n, w, tr[0]) for _, n, _, tr, w in SYSTEMS),
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


def _legend_line(c: Canvas, truth: TruthView | None) -> None:
    """The legend entry of the frame's solid vertical line: "now" while the case runs, the
    agent's end once it has ended."""
    x, y = LEGEND_X + 220, LEGEND_Y + 62
    colour, label = (SHIPPED, "now (while running)") if truth is None else (NEUTRAL,
                                                                           "agent's end")
    c.line(x, y, x + 22, y, colour, 1.6)
    c.text(x + 28, y, label, fontsize=7.5)


def _lines_over_bands(c: Canvas) -> None:
    """The hand-over, the deadline and the horizon, drawn over the bands of each frame."""
    top, bottom = TRUTH[0] - 4, CALLS[0] + CALLS[1] + 4
    for t in (HANDOVER_AT, SHIP_BY, HORIZON):
        c.line(x_of(t), top, x_of(t), bottom, "#495057", 1.2,
               "dashed" if t == SHIP_BY else "solid")


# ----------------------------------------------------------------- this frame
def _header(c: Canvas, pub: PublicView, truth: TruthView | None) -> None:
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


def _marks(c: Canvas, pub: PublicView, truth: TruthView | None) -> None:
    """The vertical lines of the moment: now (running) or the end, and t_det once ended."""
    top, bottom = TRUTH[0] - 4, CALLS[0] + CALLS[1] + 4
    rows = Rows(list(MARKS_Y))
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
        spot = rows.place(x - 3, text_width(label, bold=True)) or (x - 3, MARKS_Y[-1])
        c.text(spot[0], spot[1], label, box=True, color=colour, weight="bold")


def _footer(c: Canvas, truth: TruthView | None) -> None:
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
        while size > 6 and text_width(text, size, "weight" in kwargs) > FOOTER_WIDTH:
            size -= 0.5
        c.text(20, line_y, text, fontsize=size, **kwargs)
