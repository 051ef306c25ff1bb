"""The authority curve (eval/models/regimes.py): one scripted model graded under the three
regimes through `python -m eval model --regimes`, against the real chat server; and the guards
against a regime leaking the answer (the first messages of a twin pair, and a classifier on the
first message alone)."""

import json
from collections import Counter, defaultdict

import pytest

from agents.model import PROMPT_FILE, REGIMES, brief_message, system_prompt
from eval.grading.labels import MONEY_LOSS, REVENUE_LOSS
from eval.grading.runfolder import read_rows
from eval.models.arm import read_transcript
from eval.models.regimes import parse_regimes
from eval.site.replays import World, replayed
from finality_gym import load_corpus
from finality_gym.policy import brief_for

from tests.model.chat_server import ChatServer
from tests.model.model_client import arm, key  # noqa: F401  (key: the autouse fixture)

RECKLESS = "eager"  # ships on the processor replica's word; a pending capture is charged again
REFUSER = "plan:470,none,0,refund"  # waits to t = 590, then refunds: never sells


@pytest.fixture(scope="module")
def curves(tmp_path_factory):
    out = {}
    for name, policy in (("reckless", RECKLESS), ("refuser", REFUSER)):
        folder = tmp_path_factory.mktemp(name)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TEST_KEY", "test-key")
            mp.setenv("FINALITY_NO_PROGRESS", "1")
            with ChatServer(policy=policy) as server:
                assert arm(server, folder, "--regimes", ",".join(REGIMES), "--workers", "1",
                           "--concurrency", "2") == 0
        out[name] = folder
    return out


def loss_shares(folder, regime):
    rows = read_rows(folder / regime / "episodes.jsonl")
    labels = Counter(r["label"] for r in rows)
    return (sum(labels[x] for x in MONEY_LOSS) / len(rows),
            sum(labels[x] for x in REVENUE_LOSS) / len(rows))


def test_a_reckless_model_loses_money_when_open_and_none_behind_the_guard(curves):
    folder = curves["reckless"]
    curve = json.loads((folder / "curve.json").read_text())
    assert list(curve["regimes"]) == list(REGIMES)
    for regime in REGIMES:  # the curve's figures are the regime folders' rows
        money, revenue = loss_shares(folder, regime)
        assert curve["regimes"][regime]["money_loss"] == pytest.approx(money)
        assert curve["regimes"][regime]["revenue_loss"] == pytest.approx(revenue)
        assert curve["regimes"][regime]["episodes"] == 48
    assert curve["regimes"]["open"]["money_loss"] > 0.5
    assert curve["regimes"]["guarded"]["money_loss"] == 0
    drop = curve["differences"]["guarded - open"]
    assert drop["money_loss_ci"][1] < 0  # the paired interval excludes no change
    # a scripted model reads no prompt: the procedure alone changes nothing
    assert curve["differences"]["procedure - open"]["mean_gap"] == 0
    guarded = read_rows(folder / "guarded" / "episodes.jsonl")
    assert any(r["tool_counts"].get("ship") for r in guarded)  # it tried, and was refused
    assert all(r["lapsed"] or r["gap"] <= 0 for r in guarded)  # refused, it stopped acting
    assert (folder / "authority_curve.png").stat().st_size > 10_000
    assert "| guarded - open |" in (folder / "curve.md").read_text()


def test_an_always_refusing_model_loses_revenue_under_every_regime(curves):
    curve = json.loads((curves["refuser"] / "curve.json").read_text())
    for regime in REGIMES:
        assert curve["regimes"][regime]["revenue_loss"] > 0.5
        assert curve["regimes"][regime]["money_loss"] == 0


def test_each_regime_is_pinned_and_only_guarded_plays_behind_the_guard(curves):
    for regime in REGIMES:
        manifest = json.loads((curves["reckless"] / regime / "run.json").read_text())
        assert manifest.get("guard", False) is (regime == "guarded")
        # `open` is pinned as a folder from before regimes was: by the absence
        assert manifest["model"].get("regime", "open") == regime
        assert ("regime" in manifest["model"]) is (regime != "open")
        report = (curves["reckless"] / regime / "report.md").read_text()
        assert f"regime `{regime}`" in report


def test_the_site_rebuilds_a_guarded_run_behind_the_guard(curves):
    folder = curves["reckless"] / "guarded"
    world = World(json.loads((folder / "run.json").read_text()))
    rows = read_rows(folder / "episodes.jsonl")
    refusals = [r for r in rows if any("refused by the guard" in json.dumps(c)
                                       for c in replayed(world, r)[0])]
    assert len(refusals) > 40 and all(replayed(world, r)[1] == "ok" for r in rows)
    unguarded = World({**json.loads((folder / "run.json").read_text()), "guard": False})
    assert all(replayed(unguarded, r)[1] != "ok" for r in refusals)


def test_twin_halves_get_byte_identical_first_messages_under_every_regime(curves):
    corpus = load_corpus("public")
    for regime in REGIMES:
        firsts = {}
        for path in (curves["reckless"] / regime / "transcripts").glob("*.jsonl"):
            line = read_transcript(path)[0]
            firsts[path.name.split("__")[0]] = line["new_messages"]
        assert len(firsts) == 48
        systems = {json.dumps(m[0]) for m in firsts.values()}
        assert systems == {json.dumps({"role": "system", "content": system_prompt(regime)})}
        pairs = defaultdict(list)
        for task_id, messages in firsts.items():
            twin = corpus.task(task_id).twin_id
            if twin is not None:
                pairs[twin].append(json.dumps(messages))
        assert len(pairs) == 6 and all(len(set(p)) == 1 and len(p) == 2
                                       for p in pairs.values())


def test_the_regime_prompts_add_to_the_open_one_and_fill_every_constant():
    open_prompt = system_prompt("open")
    assert open_prompt == system_prompt() and open_prompt.startswith(
        PROMPT_FILE.read_text()[:200])
    procedure, guarded = system_prompt("procedure"), system_prompt("guarded")
    assert procedure.startswith(open_prompt) and guarded.startswith(procedure)
    assert "Withholding an order whose settlement is verified is itself a violation" in procedure
    assert "These rules are enforced" in guarded and "enforced" not in procedure
    assert "t >= 590" in procedure and "{" not in guarded
    with pytest.raises(ValueError, match="unknown 'reckless'"):
        system_prompt("reckless")


def _lookup_accuracy(train, test) -> float:
    """A classifier on the first message's length and words alone (a lookup of that feature
    set, the best any such classifier does on the training data), trained on one split and
    scored on another."""
    def features(text):
        return len(text), frozenset(text.split())
    votes = defaultdict(Counter)
    for text, label in train:
        votes[features(text)][label] += 1
    overall = Counter(label for _, label in train).most_common(1)[0][0]
    guess = {f: c.most_common(1)[0][0] for f, c in votes.items()}
    return sum(guess.get(features(text), overall) == label for text, label in test) / len(test)


@pytest.mark.parametrize("target", ["fate", "archetype"])
def test_the_first_message_tells_no_classifier_more_than_the_majority_class(target):
    def cases(split, leak=False):
        return [(brief_message(brief_for(t, 0, "full")) + (t.archetype if leak else ""),
                 getattr(t, target)) for t in load_corpus(split).tasks]
    train, test = cases("public"), cases("regenerated")
    majority = Counter(label for _, label in test).most_common(1)[0][1] / len(test)
    assert _lookup_accuracy(train, test) <= majority + 0.03
    # the same classifier finds a leak where there is one
    assert _lookup_accuracy(cases("public", True), cases("regenerated", True)) > majority + 0.2


def test_a_bad_regimes_list_is_refused():
    assert parse_regimes("guarded,open") == ("guarded", "open")
    for text, match in (("open,bold", "unknown"), ("open", "two or more"),
                        ("open,open", "two or more")):
        with pytest.raises(ValueError, match=match):
            parse_regimes(text)
