"""`python -m eval view` publishes only what it should: it reads regular files only and follows
no link, decides what is private from the rows and fingerprints themselves, checks every input
before `--out` is touched (a failure leaves it as it was), serves only to the address it prints
(a token, a Host check), and marks self-reported and development figures. The pages are read
in Debian's headless chromium (`tests/site/test_view.py`'s `dom`); `--serve` is a real server on
127.0.0.1, asked with http.client so that the Host header is the test's."""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import eval.experiments.headline as headline
import eval.site.pages as pages
import eval.site.view as view
from eval.grading.runfolder import read_rows, seal
from finality_gym import load_corpus

from tests.site.test_view import Recorder, dom, url  # skips this module too without chromium

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ("react", "finality_gate")


@pytest.fixture(scope="module")
def recorder():
    rec = Recorder()
    yield rec
    rec.sock.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A public run; a private run (its rows under opaque ids that are no published task's,
    as the private split's are); a run of the regenerated split; the operator's secrets (a
    master-seed file and a password file) outside every results folder; an earlier site."""
    base = tmp_path_factory.mktemp("runs")
    public = base / "public"
    tasks = tuple(t.task_id for t in load_corpus("public").tasks[:4])
    headline.run(public, workers=1, progress=False, seeds=1, policies=POLICIES, tasks=tasks,
                 echo=False)
    regenerated = base / "regenerated"
    headline.run(regenerated, workers=1, progress=False, split="regenerated", seeds=1,
                 policies=("react",),
                 tasks=tuple(t.task_id for t in load_corpus("regenerated").tasks[:2]),
                 echo=False)
    private = base / "private"
    private.mkdir()
    ids: dict[str, str] = {}
    rows = []
    for row in read_rows(public / "episodes.jsonl"):
        hidden = ids.setdefault(row["task_id"], secrets.token_hex(6))
        twin = row["twin_id"] and ids.setdefault(row["twin_id"], secrets.token_hex(6))
        rows.append({**row, "task_id": hidden, "twin_id": twin})
    (private / "episodes.jsonl").write_text("".join(seal(r) + "\n" for r in rows))
    manifest = json.loads((public / "run.json").read_text())
    (private / "run.json").write_text(json.dumps(
        {**manifest, "split": "private", "fingerprint": secrets.token_hex(8)}))
    (private / "transcripts").mkdir()
    (private / "transcripts" / "notes.jsonl").write_text('{"secret": "private conversation"}\n')
    secrets_dir = base / "operator"
    secrets_dir.mkdir()
    (secrets_dir / "master_seed").write_text(str((1 << 128) | 12345) + "\n")
    (secrets_dir / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    site = base / "earlier_site"
    view.build([public], site, pictures="none")
    return {"base": base, "public": public, "private": private, "regenerated": regenerated,
            "secrets": secrets_dir, "site": site}


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture
def out(runs, tmp_path):
    """An earlier site in --out, with a sentinel file: a refused build must leave both."""
    site = tmp_path / "site"
    shutil.copytree(runs["site"], site)
    (site / "sentinel.txt").write_text("still here")
    return site


def assert_untouched(out: Path, before: dict) -> None:
    assert (out / "sentinel.txt").read_text() == "still here"
    assert snapshot(out) == before
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # no staging


def shaped(runs, tmp_path) -> Path:
    """A folder that looks like a public run: a regular run.json of the public run."""
    folder = tmp_path / "shaped"
    folder.mkdir(parents=True)
    shutil.copy(runs["public"] / "run.json", folder / "run.json")
    shutil.copy(runs["public"] / "summary.json", folder / "summary.json")
    return folder


# ------------------------------------------------------------------ links and special files
LINKS = {
    # the red team's folder: the private run's rows, the password file, the master seed
    "rows of another run": ("episodes.jsonl", lambda r: r["private"] / "episodes.jsonl"),
    "a file outside": ("exact_vs_pass.png", lambda r: r["secrets"] / "passwd"),
    "the master-seed file": ("transcripts/pub-000a-pending_settle__seed0.jsonl",
                             lambda r: r["secrets"] / "master_seed"),
    "a folder": ("more", lambda r: r["private"]),
    "the run.json of another run": ("run.json", lambda r: r["private"] / "run.json"),
    "nothing (dangling)": ("figure.png", lambda r: r["base"] / "nowhere.png"),
}


@pytest.mark.parametrize("what", LINKS)
def test_a_link_under_a_dir_is_refused_naming_it_and_out_is_untouched(runs, tmp_path, out,
                                                                      what):
    folder = shaped(runs, tmp_path)
    if what != "rows of another run":
        shutil.copy(runs["public"] / "episodes.jsonl", folder / "episodes.jsonl")
    name, target = LINKS[what]
    link = folder / name
    link.parent.mkdir(exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(target(runs))
    before = snapshot(out)
    with pytest.raises(ValueError, match="is a symbolic link") as caught:
        view.build([folder], out, pictures="none")
    assert str(link) in str(caught.value)
    assert_untouched(out, before)


def test_the_red_teams_folder_is_refused_on_the_command_line(runs, tmp_path, out):
    """The three links together, through `python -m eval view`: exit 2, the first link named,
    --out as it was (its sentinel file still there)."""
    folder = shaped(runs, tmp_path)
    (folder / "episodes.jsonl").symlink_to(runs["private"] / "episodes.jsonl")
    (folder / "passwd.png").symlink_to(runs["secrets"] / "passwd")
    (folder / "seed.png").symlink_to(runs["secrets"] / "master_seed")
    before = snapshot(out)
    run = subprocess.run([sys.executable, "-m", "eval", "view", str(folder), "--out", str(out),
                          "--private"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    assert f"{folder / 'episodes.jsonl'} is a symbolic link" in run.stderr
    assert_untouched(out, before)


def test_a_dangling_link_is_refused_before_out_is_emptied(runs, tmp_path, out):
    folder = tmp_path / "run"
    shutil.copytree(runs["public"], folder)
    (folder / "gone.png").symlink_to(tmp_path / "removed.png")
    before = snapshot(out)
    run = subprocess.run([sys.executable, "-m", "eval", "view", str(folder), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and f"{folder / 'gone.png'} is a symbolic link" in run.stderr
    assert "Traceback" not in run.stderr
    assert_untouched(out, before)


def test_a_fifo_a_linked_dir_and_a_non_png_figure_are_refused(runs, tmp_path, out):
    before = snapshot(out)
    folder = tmp_path / "fifo"
    shutil.copytree(runs["public"], folder)
    os.mkfifo(folder / "figures.png")  # opening it for reading would wait for a writer
    with pytest.raises(ValueError, match="is a fifo") as caught:
        view.build([folder], out, pictures="none")
    assert str(folder / "figures.png") in str(caught.value)
    linked = tmp_path / "linked"
    linked.symlink_to(runs["public"])  # DIR itself a link
    with pytest.raises(ValueError, match="is a symbolic link, not a folder"):
        view.build([linked], out, pictures="none")
    copied = tmp_path / "copied"
    shutil.copytree(runs["public"], copied)
    (copied / "notes.png").write_text(runs["secrets"].joinpath("passwd").read_text())
    with pytest.raises(ValueError, match="is not a PNG picture"):
        view.build([copied], out, pictures="none")
    assert_untouched(out, before)


def test_a_failure_while_writing_leaves_out_as_it_was(runs, out, monkeypatch):
    """The site is built beside --out and replaces it only once whole."""
    before = snapshot(out)

    def broken(jobs, workers):
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(pages, "draw_all", broken)
    with pytest.raises(RuntimeError, match="the disk is full"):
        view.build([runs["public"]], out, pictures="some", worst=1)
    assert_untouched(out, before)
    monkeypatch.undo()
    view.build([runs["public"]], out, pictures="none")  # and a good build replaces it
    assert not (out / "sentinel.txt").exists() and (out / "index.html").is_file()


# ------------------------------------------------------------------ rows of another split
def test_rows_of_another_split_under_a_public_run_json_are_refused(runs, tmp_path, out):
    before = snapshot(out)
    for source, found in ((runs["private"], "not a task of split public"),
                          (runs["regenerated"], "not a task of split public")):
        folder = shaped(runs, tmp_path / source.name)
        shutil.copy(source / "episodes.jsonl", folder / "episodes.jsonl")  # a copy: no link
        first = read_rows(source / "episodes.jsonl")[0]["task_id"]
        for private in (False, True):  # --private does not make it a public run
            with pytest.raises(ValueError, match=found) as caught:
                view.build([folder], out, pictures="none", private=private)
            assert f"{folder / 'episodes.jsonl'}:1" in str(caught.value)
            assert repr(first) in str(caught.value)
    # the fingerprint must be the split's
    folder = tmp_path / "other_fingerprint"
    shutil.copytree(runs["public"], folder)
    manifest = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**manifest, "fingerprint": "0123456789abcdef"}))
    with pytest.raises(ValueError, match="but public's is"):
        view.build([folder], out, pictures="none")
    # a row under a public task id whose twin and archetype are another task's
    folder = tmp_path / "relabelled"
    shutil.copytree(runs["public"], folder)
    rows = read_rows(folder / "episodes.jsonl")
    other = next(r for r in rows if r["archetype"] != rows[0]["archetype"])
    rows[0] = {**rows[0], "task_id": other["task_id"]}
    (folder / "episodes.jsonl").write_text("".join(seal(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="are not those of public's task"):
        view.build([folder], out, pictures="none")
    # the summary of another split's run, shown as this one's
    folder = tmp_path / "other_summary"
    shutil.copytree(runs["public"], folder)
    shutil.copy(runs["regenerated"] / "summary.json", folder / "summary.json")
    with pytest.raises(ValueError, match="summary.json is a summary of split regenerated"):
        view.build([folder], out, pictures="none")
    assert_untouched(out, before)


def test_a_private_run_is_still_refused_without_private_and_shown_with_it(runs, tmp_path):
    with pytest.raises(ValueError, match="is a run of the private split"):
        view.build([runs["private"]], tmp_path / "s", pictures="none")
    assert not (tmp_path / "s").exists()
    built = view.build([runs["private"]], tmp_path / "s", pictures="none", private=True)
    assert built["episodes"] == len(read_rows(runs["private"] / "episodes.jsonl"))


# ------------------------------------------------------------------ the marks
def test_self_reported_and_development_figures_are_marked(runs, tmp_path, recorder):
    imported = tmp_path / "imported"
    shutil.copytree(runs["public"], imported)
    manifest = json.loads((imported / "run.json").read_text())
    (imported / "run.json").write_text(json.dumps({**manifest, "self_reported": True}))
    site = tmp_path / "site"
    view.build([runs["public"], imported, runs["private"]], site, pictures="none", private=True)
    page = dom(url(site, "index.html"), recorder)
    sections = re.split(r'<h2 id="folder-\d+">', page)[1:]
    assert len(sections) == 3
    public, reported, private = sections
    assert 'class="mark self-reported"' not in public
    assert 'class="mark self-reported"' in reported and "Self-reported:" in reported
    assert 'class="mark self-reported"' not in private
    for section in (public, reported):
        assert '<p class="note development" data-split="public">' in section
        assert ("a policy that carries the corpus can memorize these tasks; grades that count "
                "are graded on a private split (docs/trust.md)") in section
    assert "development" not in private and 'class="mark private"' in private
    row = read_rows(imported / "episodes.jsonl")[0]
    for f, marked in ((0, False), (1, True)):
        episode = dom(url(site, "episode.html", f=f, p=0, t=row["task_id"], s=row["seed"]),
                      recorder)
        assert ('<span class="mark self-reported"' in episode) is marked
        assert 'id="replayed"' in episode
    listing = dom(url(site, "episodes.html", f=1), recorder)
    assert '<span class="mark self-reported"' in listing
    assert recorder.seen == []


# ------------------------------------------------------------------ --serve
def start(args: list[str]) -> tuple[subprocess.Popen, str, int, str]:
    server = subprocess.Popen([sys.executable, "-m", "eval", "view", *args, "--pictures",
                               "none", "--serve", "--port", "0"], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    line = ""
    while "serving" not in line:
        line = server.stdout.readline()
        assert line, "the server ended before serving"
    found = re.search(r"http://127\.0\.0\.1:(\d+)/(?:([A-Za-z0-9_-]+)/)?index\.html", line)
    return server, found.group(0), int(found.group(1)), found.group(2) or ""


def ask(port: int, path: str, host: str | None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        reply = conn.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read()
    finally:
        conn.close()


def test_serve_answers_only_the_token_and_its_own_host(runs, tmp_path, recorder):
    server, address, port, token = start([str(runs["public"]), "--out", str(tmp_path / "s")])
    try:
        here = f"127.0.0.1:{port}"
        for path in ("/index.html", "/data/site.js", f"/{token[:-1]}/data/site.js",
                     f"/{token}x/data/site.js", f"/x/{token}/data/site.js", "/", f"/{token}"):
            assert ask(port, path, here)[0] in (403, 404), path
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1", f"127.0.0.1:{port + 1}",
                     f"localhost.evil.example:{port}", None):
            assert ask(port, f"/{token}/data/site.js", host)[0] in (403, 421), host
        assert len(token) >= 24
        status, headers, body = ask(port, f"/{token}/data/site.js", here)
        assert status == 200 and body.startswith(b"FG.put(")
        assert headers["Cross-Origin-Resource-Policy"] == "same-origin"
        assert ask(port, f"/{token}/index.html", f"localhost:{port}")[0] == 200
        assert ask(port, f"/{token}/", here)[0] == 200  # index.html
        assert ask(port, f"/{token}/data/", here)[0] == 404  # no folder listed
        page = dom(address, recorder)  # the site works under its token, in a browser
        assert re.search(r'<tr data-policy="react">', page)
        assert '<p class="note development" data-split="public">' in page
        assert recorder.seen == []
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_serve_private_is_token_only(runs, tmp_path):
    server, _, port, token = start([str(runs["private"]), "--out", str(tmp_path / "s"),
                                    "--private"])
    try:
        here = f"127.0.0.1:{port}"
        assert ask(port, "/data/0/rows.js", here)[0] in (403, 404)
        assert ask(port, f"/{token}/data/0/rows.js", f"evil.example:{port}")[0] in (403, 421)
        status, _, body = ask(port, f"/{token}/data/0/rows.js", here)
        assert status == 200 and b"FG.put" in body
        assert "do not share it" in server.stdout.readline()
    finally:
        server.terminate()
        server.wait(timeout=30)
