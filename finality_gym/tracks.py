"""The timeline's tracks, top to bottom: the truth (once the case has ended), the four systems
(what each read showed, and once ended the faults), and the agent's calls.

Each system track colours a band by what each read showed and labels it where that changed: the
views below put a read's result (`readings` says what it means) into a label and a colour.
"""

from __future__ import annotations

from . import readings
from .caseviews import FAULT_WORDS, FaultMark, PublicView, TruthView
from .episode import PROBE_DELAY
from .frame import (CALLS, FAILED, FAINT, FAULT, FONT, NEUTRAL, NOTHING, PAID, PENDING, RETRY,
                    RETURNED, ROW, SHIPPED, STATE_COLOUR, SYSTEMS, TRUTH, X0, X1, Canvas, Rows,
                    text_width, usd, x_of)
from .tasks import ESCALATION_DELAY, HANDOVER_AT, HORIZON

_LETTER = {tool: letter for tool, _, letter, _, _ in SYSTEMS}
_DISPOSITION_LABEL = {"ship": "SHIP", "refund": "REFUND", "write_off": "WRITE OFF",
                      "escalate": "ESCALATE", "close": "CLOSE"}


# ----------------------------------------------------------------- what a result showed
def processor_view(result: dict) -> tuple[str, str, str | None]:
    """(label, cap1's colour, the newest other capture's colour or None)."""
    ops = result["operations"]
    if not ops:
        return "no capture", NOTHING, None
    parts = [f"{op['op']} {op['status']}" + (f" ({op['decline']})" if op["decline"] else "")
             for op in ops]
    first = readings.original_capture(result)
    cap1 = NOTHING if first is None else STATE_COLOUR[readings.capture_state(first)]
    others = [o for o in ops if o["op"] != readings.ORIGINAL]
    newest = STATE_COLOUR[readings.capture_state(others[-1])] if others else None
    if len(others) > 2:  # many fresh captures: counted, or the label would not fit
        counts: dict[str, int] = {}
        for op in others:
            counts[op["status"]] = counts.get(op["status"], 0) + 1
        parts = parts[:1] if first is not None else []
        parts.append(f"{len(others)} other captures: "
                     + ", ".join(f"{n} {status}" for status, n in counts.items()))
    return ", ".join(parts), cap1, newest


def ledger_view(result: dict) -> tuple[str, str, str | None]:
    if not result["entries"]:
        return "no entries", NOTHING, None
    balances = result["balances"]
    label = f"cash {usd(balances['cash'])} · clearing {usd(balances['clearing'])}"
    if result["imbalance"]:
        label += f" · imbalance {usd(result['imbalance'])}"
    return label, STATE_COLOUR[readings.ledger_state(result)], None


def erp_view(result: dict) -> tuple[str, str, str | None]:
    status = result["status"]
    label = "no status" if status is None else status.replace("_", " ")
    return label, STATE_COLOUR[readings.ERP_STATE[status]], None


def bank_view(result: dict) -> tuple[str, str, str | None]:
    if not result["lines"]:
        return "no lines", NOTHING, None
    totals = readings.bank_totals(result)
    parts = []
    for name, amount, lines in (("credits", totals.credits, totals.credit_lines),
                                ("debits", totals.debits, totals.debit_lines)):
        if lines:
            parts.append(f"{name} {usd(amount)}" + (f" ({lines} lines)" if lines > 1 else ""))
    return " · ".join(parts), STATE_COLOUR[readings.bank_state(result)], None


_VIEWS = {"read_processor": processor_view, "read_ledger": ledger_view, "read_erp": erp_view,
          "read_bank": bank_view}


def probe_view(result: dict) -> tuple[str, str]:
    if readings.refused(result):
        return "probe refused", FAILED
    captures = result["captures"]
    if not captures:
        return "probe: no capture yet", NOTHING
    text = ", ".join(f"{op} {answer}" for op, answer in captures.items())
    return f"probe: {text}", STATE_COLOUR[readings.original_answer(result) or readings.UNKNOWN]


# ----------------------------------------------------------------- label and band
def _label(c: Canvas, rows: Rows, x: float, anchor_y: float, text: str,
           shift: float = 160, **kwargs) -> bool:
    """A label for a mark at column x: in the first free row, or moved right with a leader.
    False if there was no room (the label is left out)."""
    width = text_width(text, kwargs.get("fontsize", FONT), kwargs.get("weight") == "bold")
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


def _band(c: Canvas, x0: float, x1: float, y: float, h: float, colour: str,
          newest: str | None) -> None:
    x1 = max(x1, x0 + 1)
    if newest is None:
        c.rect(x0, y, x1 - x0, h, colour)
    else:  # another capture exists: a thin strip of its status above cap1's
        c.rect(x0, y, x1 - x0, h / 3, newest)
        c.rect(x0, y + h / 3 + 1, x1 - x0, 2 * h / 3 - 1, colour)


def _label_rows(top: float) -> Rows:
    return Rows([top + 10, top + 10 + ROW, top + 10 + 2 * ROW])


# ----------------------------------------------------------------- the systems and the calls
def system_track(c: Canvas, pub: PublicView, truth: TruthView | None, tool: str,
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


def _fault(c: Canvas, mark: FaultMark, band_y: float, band_h: float) -> str:
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


def calls_track(c: Canvas, pub: PublicView, truth: TruthView | None) -> None:
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
    letters = Rows([reads_y - 10])
    for x, _, text in groups:
        spot = letters.place(x - 2, text_width(text, 6.5), gap=2)
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
            if x1 - x > text_width(label, 6.5) + 4:
                c.text((x + x1) / 2, waits_y, label, ha="center", fontsize=6.5, color="white")
            continue
        final = False
        if tool == "probe_processor":
            label, colour = probe_view(result)
            if pub.probe == "delayed" and not readings.refused(result):
                label = label.replace("probe:", f"probe (as of t={t - PROBE_DELAY}):", 1)
            marker, size = ("X", 40) if readings.refused(result) else ("D", 34)
        elif tool == "retry_capture":
            fresh = args.get("key") == "fresh"
            captures += fresh
            label = "retry with a FRESH key" if fresh else "retry cap1 with its original key"
            colour, marker, size = (FAILED if fresh else RETRY), "^", 50
        elif readings.refused(result):
            label, colour, marker, size = f"{tool} refused (after the deadline)", FAILED, "X", 50
        else:
            label, colour, marker, size = _DISPOSITION_LABEL.get(tool, tool), NEUTRAL, "s", 70
            final = True
        c.mark(x, acts_y, colour, marker, size)
        run = runs[-1] if runs else None
        if run is not None and run[3] == label and x - x_of(run[0]) < text_width(f"t={t} {label}"):
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


def truth_track(c: Canvas, truth: TruthView | None) -> None:
    top, height = TRUTH
    band_y, band_h = top + 50, 18
    if truth is None:
        x0, x1 = X0 + 2, X1 - 2
        c.rect(x0, top + 6, x1 - x0, height - 12, "#f8f9fa", z=0.7)
        for x in range(int(x0), int(x1) - 10, 14):
            c.line(x, top + 6, x + 10, top + height - 6, "#e9ecef", 0.8, z=0.8)
        label = "truth: hidden until the case ends"
        left = (x0 + x1 - text_width(label, 12, bold=True)) / 2
        c.text(left, top + height / 2, label, box=True, fontsize=12, color=FAINT,
               weight="bold")
        return
    end_x = x_of(truth.rec.end_t)
    c.rect(end_x, top + 4, X1 - end_x, height - 8, (0.906, 0.961, 1.0, 0.8), z=0.7)
    c.text(X1 - 4, top + height - 10, "after the agent's end the world runs on to the horizon",
           ha="right", fontsize=6.5, color=FAINT)
    # each capture's true status, from the log (an event with an operation changes it), as the
    # colour of its last event
    status: dict = {}
    changes: list = []
    for event in truth.log:
        if event.op is not None:
            status[event.op] = _EVENT_COLOUR[event.kind]
            changes.append((event.t, dict(status)))
    for i, (t, state) in enumerate(changes):
        end = changes[i + 1][0] if i + 1 < len(changes) else HORIZON
        if end < HANDOVER_AT:
            continue
        others = [op for op in state if op != readings.ORIGINAL]
        _band(c, x_of(t), x_of(end), band_y, band_h, state.get(readings.ORIGINAL, NOTHING),
              state[others[-1]] if others else None)
    if any(op != readings.ORIGINAL for op in status):
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

