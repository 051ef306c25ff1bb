"""What kind of mistake an episode made, derived from its record alone.

Labels, first match wins: `exact` (gap 0), `beat_reference` (gap < 0: a refusal on a task the
reference lost on), `lapsed` (the case timed out), `escalated` (paid the specialist),
`shipped_unpaid` (goods left without the order value held at the horizon), `double_charge`
(goods left and more than the order value collected), `held_unshipped` (money kept on an
unshipped order: a dispute waiting to happen), `false_refusal` (nothing shipped and nothing
held, where the reference sold).

Two kinds of failure are kept apart (the authority curve's, `eval/models/regimes.py`, and the
verifiers environment's metrics): `MONEY_LOSS`, the agent released what it should have held
(goods out unpaid, a card charged twice), and `REVENUE_LOSS`, it held what it should have
released (a refused sale, money kept on an unshipped order).
"""

from __future__ import annotations

LABELS = ("exact", "beat_reference", "lapsed", "escalated", "shipped_unpaid", "double_charge",
          "held_unshipped", "false_refusal")
MONEY_LOSS = ("shipped_unpaid", "double_charge")
REVENUE_LOSS = ("false_refusal", "held_unshipped")


def failure_label(record) -> str:
    if record.gap == 0:
        return "exact"
    if record.gap < 0:
        return "beat_reference"
    if record.lapsed:
        return "lapsed"
    if record.escalated:
        return "escalated"
    if record.goods_left:
        return "shipped_unpaid" if record.cash < record.order_value else "double_charge"
    if record.liability > 0:
        return "held_unshipped"
    return "false_refusal"
