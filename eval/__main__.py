"""`python -m eval NAME ...`: the benchmark's experiments, each resumable into its folder.

    headline   nine policies x 321 tasks x 5 seeds, tables and figures (the main job)
    ablation   each fault family alone and removed, no late_chargeback, loss x delay
    tuning     sop's knobs on public, re-measured on regenerated
    costs      45 cost configurations, re-priced from the headline records
    plans      1,215 open-loop plans on 40 tasks against the reference
    all        all of the above into one folder, with an index report
    model      a language model behind a Chat Completions endpoint, acting through tool calls
    show       one episode of one policy, drawn as a timeline PNG
    baselines  the learned baselines of the sweeps given, one table (into the README)
    versus     two sweeps of one probe arm compared (say RecurrentPPO's and PPO's): A - B
    view       every graded episode of results folders, as a static site (or --serve it)
    import-inspect  an inspect_ai log of eval/inspect_task.py as a model-arm results folder
    keygen     a private split's master seed (128 random bits) into a new file of mode 0600
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from agents.spec import split_specs
from finality_gym import PROBE_ARMS, SPLITS, load_corpus
from finality_gym.corpus import PRIVATE, check_master_seed, new_master_seed

from agents.model import (DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_MAX_TRANSCRIPT_BYTES,
                          ConfigurationError, ModelConfig)

from . import (ablation, baselines, costs, headline, import_inspect, model_arm, plans, show,
               tuning, versus, view)
from .headline import HEADLINE
from .grader import BACKENDS, Incomplete

EXIT_INCOMPLETE = 3  # some episode is ungraded: the endpoint failed past every retry




def run_all(out: Path, workers: int, progress: bool, backend: str) -> None:
    started = time.perf_counter()
    head = headline.run(out / "headline", workers, progress, backend=backend)
    abl = ablation.run(out / "ablation", workers, progress, baseline_dir=out / "headline",
                       backend=backend)
    tun = tuning.run(out / "tuning", workers, progress, backend=backend)
    cst = costs.run(out / "costs", workers, progress, headline_dir=out / "headline",
                    backend=backend)
    pln = plans.run(out / "plans", workers, progress, backend=backend)
    gate = head["policies"].get("finality_gate", {})
    lines = [
        "# finality-gym: every experiment", "",
        f"Split `public`, fingerprint `{load_corpus('public').fingerprint}`; `regenerated` "
        f"`{load_corpus('regenerated').fingerprint}`. Wall time "
        f"{time.perf_counter() - started:.0f} s.", "",
        f"- [Headline](headline/report.md): the finality gate's mean gap "
        f"${gate.get('mean_gap', float('nan')):.2f} [{gate['mean_gap_ci'][0]:.2f}, "
        f"{gate['mean_gap_ci'][1]:.2f}], exact "
        f"{100 * gate.get('exact', float('nan')):.1f}%; rankings by exact rate and by paired "
        f"loss disagree in {head['rankings']['disagreements']} places.",
        f"- [Ablation](ablation/report.md): loss x delay interaction for sop "
        f"${abl['loss_x_delay']['sop']['interaction']:.2f} "
        f"{abl['loss_x_delay']['sop']['interaction_ci']}.",
        f"- [Tuning](tuning/report.md): tuned `{tun['tuned']['policy']}` changes by "
        f"${tun['tuned']['change']:+.2f} {tun['tuned']['change_ci']} from public to regenerated;"
        f" the default by ${tun['default']['change']:+.2f} {tun['default']['change_ci']}.",
        f"- [Cost sweep](costs/report.md): same ordering as the default in "
        f"{cst['same_order_as_default']} of 45 configurations; the gate ahead of every ungated "
        f"policy in {cst['gate_ahead_of_every_ungated']} of 45.",
        f"- [Reference check](plans/report.md): a plan beats the reference on "
        f"{pln['tasks_where_a_plan_beats_the_reference']} of {len(pln['tasks'])} tasks.", ""]
    (out / "index.md").write_text("\n".join(lines))
    print(f"wrote {out}/index.md in {time.perf_counter() - started:.1f} s")


def _param(text: str) -> tuple[str, str]:
    """`--param KEY=JSON` as (KEY, JSON); ModelConfig checks the value."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--param {text}: expected KEY=JSON, e.g. reasoning_effort='\"low\"'")
    return key, value


MASTER_SEED_FILE_MAX = 1024  # bytes: a seed is at most 78 digits; more is not a seed file


def master_seed(args: argparse.Namespace) -> int | None:
    """The private split's master seed from one of its three sources, never two, checked by
    `check_master_seed` (2**127 <= seed < 2**256: `python -m eval keygen --out FILE` makes
    one). No error shows the seed."""
    given = {"--master-seed": args.master_seed, "--master-seed-file": args.master_seed_file,
             "FINALITY_MASTER_SEED": os.environ.get("FINALITY_MASTER_SEED")}
    given = {k: v for k, v in given.items() if v is not None}
    if len(given) > 1:
        raise ValueError(f"give the master seed once, not by {' and '.join(given)}")
    if not given:
        return None
    source, value = given.popitem()
    if source == "--master-seed-file":
        try:
            with open(value, "rb") as f:
                data = f.read(MASTER_SEED_FILE_MAX + 1)
        except OSError as exc:
            raise ValueError(f"--master-seed-file {value}: {exc.strerror}") from None
        if len(data) > MASTER_SEED_FILE_MAX:
            raise ValueError(f"--master-seed-file {value}: over {MASTER_SEED_FILE_MAX} bytes, "
                             "not a master seed (one decimal integer)")
        value = data.decode("ascii", errors="replace").strip()
    try:
        seed = int(value)
    except ValueError:
        raise ValueError(f"{source}: the master seed must be an integer") from None
    try:
        return check_master_seed(seed)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def keygen(path: Path) -> None:
    """Write a new master seed (`new_master_seed`: 128 random bits) to `path`, a file made
    here with mode 0600 and never one that exists; print where, never the seed."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        raise ValueError(f"keygen: {path} exists; keygen never overwrites a master seed "
                         "(move it away, or give another --out)") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{new_master_seed()}\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    print(f"keygen: wrote a master seed (128 random bits) to {path} (mode 0600); keep it "
          f"secret, and grade with: python -m eval headline --split private "
          f"--master-seed-file {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    parsers = {}
    for name in ("headline", "ablation", "tuning", "costs", "plans", "all", "model"):
        p = sub.add_parser(name, help=__doc__.split(name, 1)[1].splitlines()[0].strip())
        p.add_argument("--out", type=Path, default=Path("results") / name,
                       help="results folder (re-running into it resumes)")
        p.add_argument("--workers", type=int, default=2, help="worker processes")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument("--backend", choices=BACKENDS, default="local",
                       help="where the grader's chunks run: local processes, or Ray tasks "
                            "(joins RAY_ADDRESS, else starts Ray here; the ray extra)")
        parsers[name] = p
    for name in ("ablation", "tuning", "costs"):
        parsers[name].add_argument("--seeds", type=int, default=5, help="episode seeds 0..N-1")
    h = parsers["headline"]
    h.add_argument("--split", choices=[*SPLITS, PRIVATE], default="public",
                   help="private: generated from --master-seed (for leaderboard operators)")
    h.add_argument("--master-seed-file", type=Path, default=None,
                   help="a file holding the private split's master seed (or set "
                        "FINALITY_MASTER_SEED), at least 2**127 and below 2**256: make one "
                        "with `python -m eval keygen --out FILE`; only its fingerprint is "
                        "printed and written, never the seed")
    h.add_argument("--master-seed", type=int, default=None,
                   help="the master seed on the command line: WARNING, every process of the "
                        "machine can read a command line; prefer --master-seed-file")
    h.add_argument("--sandbox", choices=("on", "off"), default="on",
                   help="run outside policies in the operating-system sandbox (default on; "
                        "off is refused for --split private)")
    h.add_argument("--seeds", type=int, default=5, help="episode seeds 0..N-1")
    h.add_argument("--policies", type=split_specs, action="extend", default=None,
                   help="policy specs, comma-separated or repeated (default: the nine): names, "
                        "sop:poll_interval=30,max_polls=6, plan:60,original,120,ship, ppo:PATH "
                        "or sb3:PATH (a saved model of PPO, or of any SB3 algorithm, read as "
                        "data: no pickle in it runs), FILE.py:CLASS or MODULE:CLASS (your own "
                        "Policy, graded in its own process, in the sandbox)")
    h.add_argument("--trust-pickles", action="store_true",
                   help="load ppo:/sb3: models by unpickling them, as stable-baselines3 does "
                        "(code in the file runs in the grader: trusted files only; recorded in "
                        "run.json; refused for --split private); only for a model whose "
                        "fields exist only as pickles")
    h.add_argument("--probe", choices=list(PROBE_ARMS), default="full")
    h.add_argument("--tasks", type=lambda text: tuple(t for t in text.split(",") if t),
                   default=None, help="only these task ids, comma-separated (a quick look or a "
                                      "test; the headline itself is the whole split)")
    show.add_arguments(sub.add_parser("show", help="one episode of one policy, drawn as a "
                                      "timeline PNG"))
    baselines.add_arguments(sub.add_parser(
        "baselines", help="the learned baselines of the sweeps given, one table (into the "
                          "README)"))
    versus.add_arguments(sub.add_parser(
        "versus", help="two sweeps of one probe arm compared (say RecurrentPPO's and PPO's): "
                       "A - B"))
    view.add_arguments(sub.add_parser("view", help="every graded episode of results folders, "
                                      "as a static site (or --serve it)"))
    import_inspect.add_arguments(sub.add_parser(
        "import-inspect", help="an inspect_ai log of eval/inspect_task.py as a model-arm "
                               "results folder"))
    k = sub.add_parser("keygen", help="a private split's master seed (128 random bits) into a "
                                      "new file of mode 0600")
    k.add_argument("--out", type=Path, required=True,
                   help="the file to create (never overwritten); give it to `headline --split "
                        "private --master-seed-file`")
    m = parsers["model"]
    m.add_argument("--model", required=True, help="the model's name at the endpoint")
    m.add_argument("--base-url", required=True,
                   help="the OpenAI-compatible endpoint, e.g. http://localhost:11434/v1")
    m.add_argument("--api-key-env", default=None,
                   help="the environment variable holding the API key (none for local servers)")
    m.add_argument("--split", choices=list(SPLITS), default="public")
    m.add_argument("--subset", choices=("stratified", "all"), default="stratified",
                   help="48 stratified tasks (default) or the whole split")
    m.add_argument("--seeds", type=int, default=1, help="episode seeds 0..N-1")
    m.add_argument("--probe", choices=list(PROBE_ARMS), default="full")
    m.add_argument("--concurrency", type=int, default=1, help="episodes in flight (threads)")
    m.add_argument("--temperature", type=float, default=0.0)
    m.add_argument("--price-in", type=float, default=None,
                   help="dollars per million prompt tokens: each episode's cost in its row")
    m.add_argument("--price-out", type=float, default=None,
                   help="dollars per million completion tokens (reasoning tokens included)")
    m.add_argument("--max-cost", type=float, default=None,
                   help="dollars: no episode starts once the run has spent this (exit 3; "
                        "re-run with a larger budget to go on)")
    m.add_argument("--param", action="append", default=[], metavar="KEY=JSON",
                   help="one more request field, repeatable: reasoning_effort='\"low\"', "
                        "top_p=0.9, seed=7 (pinned in run.json)")
    m.add_argument("--no-param", action="append", default=[], metavar="KEY",
                   help="a field never sent, repeatable: temperature, max_tokens (pinned)")
    m.add_argument("--max-tokens", type=int, default=1024, help="per response")
    m.add_argument("--max-total-tokens", type=int, default=None,
                   help="per episode; reaching it lapses the case (agent_status token_cap)")
    m.add_argument("--timeout", type=float, default=120.0,
                   help="seconds: a deadline for each request attempt as a whole (connecting, "
                        "sending, reading), not for each read; past it the attempt is cut and "
                        "retried (default 120)")
    m.add_argument("--max-retries", type=int, default=6, help="per request, for transient errors")
    m.add_argument("--max-response-bytes", type=int, default=DEFAULT_MAX_RESPONSE_BYTES,
                   metavar="N", help="bytes a response may take over the wire, headers "
                   "included; reading stops past it and the attempt is retried (default "
                   f"{DEFAULT_MAX_RESPONSE_BYTES}, 8 MiB)")
    m.add_argument("--max-transcript-bytes", type=int, default=DEFAULT_MAX_TRANSCRIPT_BYTES,
                   metavar="N", help="bytes an episode's transcript may take; past it the "
                   "episode is not graded (exit 3; re-run with a larger cap to complete it) "
                   f"(default {DEFAULT_MAX_TRANSCRIPT_BYTES}, 64 MiB)")
    args = parser.parse_args(argv)
    progress = not getattr(args, "no_progress", False)
    started = time.perf_counter()
    try:
        if getattr(args, "backend", "local") == "ray":  # Ray missing: say so before any output
            from .distributed import require_ray
            require_ray()
        if args.command == "headline":
            headline.run(args.out, args.workers, progress, split=args.split, seeds=args.seeds,
                         policies=tuple(args.policies or HEADLINE), probe=args.probe,
                         master_seed=master_seed(args), backend=args.backend,
                         sandbox=args.sandbox == "on", tasks=args.tasks,
                         trust_pickles=args.trust_pickles)
        elif args.command == "show":
            return show.main(args)
        elif args.command == "baselines":
            return baselines.main(args)
        elif args.command == "versus":
            return versus.main(args)
        elif args.command == "view":
            return view.main(args)
        elif args.command == "import-inspect":
            return import_inspect.main(args)
        elif args.command == "keygen":
            keygen(args.out)
            return 0
        elif args.command == "all":
            run_all(args.out, args.workers, progress, args.backend)
        elif args.command == "plans":
            plans.run(args.out, args.workers, progress, backend=args.backend)
        elif args.command == "model":
            config = ModelConfig(model=args.model, base_url=args.base_url,
                                 api_key_env=args.api_key_env, temperature=args.temperature,
                                 max_tokens=args.max_tokens,
                                 max_total_tokens=args.max_total_tokens, timeout_s=args.timeout,
                                 params=tuple(_param(text) for text in args.param),
                                 no_params=tuple(args.no_param), price_in=args.price_in,
                                 price_out=args.price_out, max_cost=args.max_cost,
                                 max_retries=args.max_retries,
                                 max_response_bytes=args.max_response_bytes,
                                 max_transcript_bytes=args.max_transcript_bytes)
            model_arm.run(args.out, config, split=args.split, subset=args.subset,
                          seeds=args.seeds, probe=args.probe, concurrency=args.concurrency,
                          workers=args.workers, progress=progress, backend=args.backend)
        else:
            {"ablation": ablation, "tuning": tuning, "costs": costs}[args.command].run(
                args.out, args.workers, progress, seeds=tuple(range(args.seeds)),
                backend=args.backend)
    except Incomplete as exc:
        print(exc, file=sys.stderr)
        return EXIT_INCOMPLETE
    except (ValueError, OSError, ConfigurationError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.command}: results in {args.out} ({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
