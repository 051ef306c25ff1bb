"""The results site (`python -m eval view`), checked in a real browser: Debian's headless chromium
loads the built pages from file:// and the DOM is read after the scripts ran (`--dump-dom`).
Every request the browser makes to the network goes through a recording proxy, which must see
none (a page that does reach out is shown to be caught)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

import eval.experiments.headline as headline
import eval.models.arm as model_arm
import eval.site.view as view
from eval.grading.runfolder import read_rows, seal
from agents.model import ModelConfig
from finality_gym import load_corpus

from tests.model.chat_server import ChatServer, misbehave_schedule

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:  # never in CI: `make test` installs it, and there a skip is a failure
    if os.environ.get("FINALITY_REQUIRE_BROWSER"):
        raise RuntimeError("chromium is missing and FINALITY_REQUIRE_BROWSER is set")
    pytest.skip("chromium is not installed (the `chromium` package): the site's browser tests "
                "skip", allow_module_level=True)
POLICIES = ("react", "finality_gate", "eager")
# What headless chromium asks of its own accord (its clock, its component updater, its account
# service), whatever page it shows: the page's own requests are everything else.
BROWSER_OWN = {"clients2.google.com", "update.googleapis.com", "accounts.google.com"}


class Recorder:
    """A proxy that answers nothing and records the host of every request made through it;
    `seen` holds those the page made (the browser's own are left out)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    line = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                except OSError:
                    line = "? ?"
                if not line:  # a connection the browser opened ahead and closed unused: no request
                    continue
                target = line.split(" ")[1] if " " in line else line
                host = re.sub(r"^[a-z]+://", "", target).split("/")[0].rsplit(":", 1)[0]
                if host not in BROWSER_OWN:
                    self.seen.append(host)


@pytest.fixture(scope="module")
def recorder():
    rec = Recorder()
    yield rec
    rec.sock.close()


def dom(url: str, recorder: Recorder) -> str:
    """The page's DOM once its scripts ran, every outside request sent to `recorder`."""
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", "--disable-extensions", "--disable-sync",
                          "--disable-background-networking", "--disable-component-update",
                          f"--proxy-server=http://127.0.0.1:{recorder.port}",
                          "--virtual-time-budget=15000", "--dump-dom", url],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    assert 'data-ready="1"' in run.stdout, run.stdout[-3000:]
    return run.stdout


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A small headline folder, and a model arm through the scripted chat server whose model
    once answers without a tool call and once calls a tool that does not exist."""
    base = tmp_path_factory.mktemp("results")
    tasks = tuple(t.task_id for t in load_corpus("public").tasks[:8])
    headline.run(base / "headline", workers=1, progress=False, seeds=2, policies=POLICIES,
                 tasks=tasks, echo=False)
    os.environ["TEST_KEY"] = "test-key"
    with ChatServer(policy="react",
                    misbehave=misbehave_schedule({1: "text_only", 3: "unknown_tool"})) as server:
        model_arm.run(base / "model", ModelConfig(model="scripted-model",
                                                   base_url=server.base_url,
                                                   api_key_env="TEST_KEY", timeout_s=30.0,
                                                   price_in=1.0, price_out=4.0),
                      seeds=1, concurrency=2, workers=1, progress=False)
    shutil.rmtree(base / "model" / "scripted")  # its nine policies: not needed here
    # Four of the model's 48 episodes are enough here (every model episode gets a picture)
    rows = read_rows(base / "model" / "episodes.jsonl")[:4]
    (base / "model" / "episodes.jsonl").write_text("".join(seal(r) + "\n" for r in rows))
    return base


@pytest.fixture(scope="module")
def site(folders, tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "site"
    built = view.build([folders / "headline", folders / "model"], out, pictures="some",
                       worst=1)
    return out, built


def url(site_dir: Path, page: str, **params) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return (site_dir / page).as_uri() + (f"#{query}" if query else "")


def test_the_index_shows_every_policy_with_its_figures(folders, site, recorder):
    out, _ = site
    page = dom(url(out, "index.html"), recorder)
    summary = json.loads((folders / "headline" / "summary.json").read_text())
    for policy in POLICIES:
        x = summary["policies"][policy]
        row = re.search(rf'<tr data-policy="{policy}">(.*?)</tr>', page).group(1)
        assert f'<td data-v="{x["mean_gap"]:g}">{x["mean_gap"]:.2f} [' in row
        assert f'<td data-v="{x["exact"]:g}">' in row and f'<td data-v="{x["premature"]:g}">' in row
    model = re.search(r'<tr data-policy="model:scripted-model">(.*?)</tr>', page).group(1)
    arm = json.loads((folders / "model" / "summary.json").read_text())["model_arm"]
    assert f'{arm["model:scripted-model"]["requests_per_episode"]}' in model
    assert "exact_vs_pass.png" in page and "model_arm.png" in page
    assert '<img id="cost-figure" src="figures/models_cost.png"' in page  # a priced model run
    assert (out / "figures" / "models_cost.png").stat().st_size > 10_000
    assert "pending_fail" in page  # the per-archetype table
    assert int(re.search(r'data-render-ms="(\d+)"', page).group(1)) > 0
    assert recorder.seen == []


def test_filtering_to_one_archetype_leaves_only_its_rows(folders, site, recorder):
    out, _ = site
    rows = read_rows(folders / "headline" / "episodes.jsonl")
    archetype = rows[0]["archetype"]
    page = dom(url(out, "episodes.html", f=0, archetype=archetype), recorder)
    shown = re.findall(r'<tr data-archetype="([^"]+)" data-policy="([^"]+)"', page)
    assert {a for a, _ in shown} == {archetype}
    assert len(shown) == sum(r["archetype"] == archetype for r in rows) < len(rows)
    page = dom(url(out, "episodes.html", f=0, policy=1, lapsed=0), recorder)
    shown = re.findall(r'<tr data-archetype="[^"]+" data-policy="([^"]+)"', page)
    assert set(shown) == {POLICIES[1]}
    assert len(shown) == sum(r["policy"] == POLICIES[1] and not r["lapsed"] for r in rows)
    assert recorder.seen == []


def test_an_episode_page_shows_the_graded_episode_its_picture_and_calls(folders, site,
                                                                         recorder):
    out, _ = site
    rows = [r for r in read_rows(folders / "headline" / "episodes.jsonl")
            if r["policy"] == "react"]
    worst = max(rows, key=lambda r: r["gap"])  # drawn at build time (worst=1)
    page = dom(url(out, "episode.html", f=0, p=0, t=worst["task_id"], s=worst["seed"]),
               recorder)
    shown = [[int(t), tool, *json.loads(html_unescape(args)).values()] for t, tool, args in
             re.findall(r'<tr data-t="(\d+)" data-tool="([a-z_]+)" data-args="([^"]*)"', page)]
    assert shown == worst["calls"] and len(shown) == worst["calls_used"]
    assert re.search(r'<img class="picture" src="pictures/0/0/[^"]+\.png"', page)
    assert 'id="replayed"' in page and "its record equals the graded one" in page
    assert f"-${abs(worst['gap']) / 100:,.2f}" in page or f"${worst['gap'] / 100:,.2f}" in page
    # the other half of the twin pair, and the same case under the other policies
    if worst["twin_id"]:
        assert re.search(r'<a id="twin" href="episode.html#f=0&amp;p=0&amp;t=pub-', page)
    assert len(re.findall(r'class="same-case"', page)) == len(POLICIES) - 1
    assert recorder.seen == []


def test_a_model_episode_page_shows_the_whole_conversation(folders, site, recorder):
    out, _ = site
    row = read_rows(folders / "model" / "episodes.jsonl")[0]
    page = dom(url(out, "episode.html", f=1, p=0, t=row["task_id"], s=row["seed"]), recorder)
    kinds = re.findall(r'data-kind="([a-z_]+)"', page)
    assert kinds.count("system") == 1 and kinds.count("brief") == 1
    assert kinds.count("assistant") == row["requests"]
    assert kinds.count("reminder") == 1 and kinds.count("invalid") == 1
    # every call's result goes back to the model but the last one's: that call ended the case
    assert kinds.count("result") == row["calls_used"] - 1
    assert "tokens in" in page and 'id="conversation"' in page
    assert re.search(r'<img class="picture"', page)  # every model episode is drawn
    assert recorder.seen == []


def test_side_by_side_shows_both_policies_aligned_on_the_clock(folders, site, recorder):
    out, _ = site
    rows = read_rows(folders / "headline" / "episodes.jsonl")
    a = next(r for r in rows if r["policy"] == "react" and r["calls_used"] > 3)
    b = next(r for r in rows if r["policy"] == "finality_gate" and r["task_id"] == a["task_id"]
             and r["seed"] == a["seed"])
    page = dom(url(out, "compare.html", t=a["task_id"], s=a["seed"], a="0.0", b="0.1"),
               recorder)
    assert re.search(r'<th class="l" id="left">react \(headline\)</th>', page)
    assert re.search(r'<th class="l" id="right">finality_gate \(headline\)</th>', page)
    times = [int(t) for t in re.findall(r'<tr data-t="(\d+)"', page)]
    assert times == sorted({c[0] for c in a["calls"]} | {c[0] for c in b["calls"]})
    assert recorder.seen == []


def test_the_recording_proxy_catches_a_page_that_reaches_out(tmp_path, recorder):
    """The control: without it, an empty record could mean the proxy was never used."""
    page = tmp_path / "out.html"
    page.write_text('<html><body data-ready="1"><img src="http://example.test/x.png">'
                    "</body></html>")
    dom(page.as_uri(), recorder)
    assert "example.test" in recorder.seen
    recorder.seen.clear()


def html_unescape(text: str) -> str:
    import html
    return html.unescape(text)


# ------------------------------------------------------------------ the build, without a browser
def _task_file(out: Path, folder: int, task_id: str) -> dict:
    text = (out / "data" / str(folder) / "tasks" / f"{task_id}.js").read_text()
    return json.loads(text[text.index(",") + 1:text.rindex(")")])


def test_every_episode_replays_to_its_record_and_the_site_stays_offline(folders, site):
    out, built = site
    rows = read_rows(folders / "headline" / "episodes.jsonl")
    assert built["episodes"] == len(rows) + 4
    assert built["pictures"] == len(POLICIES) + 4  # the worst of each policy; every model episode
    for task_id in {r["task_id"] for r in rows}:
        assert {e["replayed"] for e in _task_file(out, 0, task_id)["episodes"]} == {"ok"}
    for path in out.rglob("*"):
        if path.suffix in (".html", ".js", ".css"):
            assert not re.search(r"(src|href)=[\"']?(https?:)?//", path.read_text()), path


def test_a_folder_graded_before_calls_were_recorded_gets_pages_that_say_why(folders, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(folders / "headline", old)
    rows = read_rows(old / "episodes.jsonl")
    tampered = dict(rows[1], calls=rows[1]["calls"][1:])  # one call fewer: does not replay
    lines = [{k: v for k, v in rows[0].items() if k != "calls"}, tampered, *rows[2:]]
    (old / "episodes.jsonl").write_text("".join(seal(r) + "\n" for r in lines))
    built = view.build([old], tmp_path / "site", pictures="none")
    assert built["pictures"] == 0
    first = _task_file(tmp_path / "site", 0, rows[0]["task_id"])["episodes"]
    entry = next(e for e in first if e["p"] == 0 and e["seed"] == rows[0]["seed"])
    assert entry["calls"] is None and entry["picture"] is None
    assert "graded before the grader recorded" in entry["replayed"]
    second = _task_file(tmp_path / "site", 0, rows[1]["task_id"])["episodes"]
    entry = next(e for e in second if e["p"] == 0 and e["seed"] == rows[1]["seed"])
    assert entry["replayed"].startswith(("the recorded calls do not replay",
                                         "the calls replay, but to another record"))


def test_bad_input_is_refused_and_changes_nothing(folders, tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    run = subprocess.run([sys.executable, "-m", "eval", "view", str(folders / "headline"),
                          "--out", str(keep)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and "holds something other than a site" in run.stderr
    assert [p.name for p in keep.iterdir()] == ["notes.txt"]
    run = subprocess.run([sys.executable, "-m", "eval", "view", str(tmp_path / "nowhere"),
                          "--out", str(tmp_path / "s")], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 2 and "is not a folder" in run.stderr
    assert not (tmp_path / "s").exists()
    hidden = tmp_path / "private"
    shutil.copytree(folders / "headline", hidden)
    manifest = json.loads((hidden / "run.json").read_text())
    (hidden / "run.json").write_text(json.dumps({**manifest, "split": "private"}))
    run = subprocess.run([sys.executable, "-m", "eval", "view", str(hidden), "--out",
                          str(tmp_path / "s")], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and "is a run of the private split" in run.stderr
    assert not (tmp_path / "s").exists()


def test_serve_draws_a_picture_on_its_first_request(folders, tmp_path):
    out = tmp_path / "site"
    server = subprocess.Popen([sys.executable, "-m", "eval", "view", str(folders / "headline"),
                               "--out", str(out), "--pictures", "none", "--serve", "--port",
                               "0"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while "serving" not in line:
            line = server.stdout.readline()
            assert line, "the server ended before serving"
        base = re.search(r"(http://127\.0\.0\.1:\d+/[A-Za-z0-9_-]+)/index\.html", line).group(1)
        row = read_rows(folders / "headline" / "episodes.jsonl")[5]
        picture = f"pictures/0/0/{row['task_id']}__s{row['seed']}.png"
        assert not (out / picture).exists()
        with urllib.request.urlopen(f"{base}/{picture}", timeout=120) as reply:
            assert reply.status == 200 and reply.read(8) == b"\x89PNG\r\n\x1a\n"
        assert (out / picture).exists()
        with urllib.request.urlopen(f"{base}/index.html", timeout=30) as reply:
            assert b"assets/app.js" in reply.read()
    finally:
        server.terminate()
        server.wait(timeout=30)
