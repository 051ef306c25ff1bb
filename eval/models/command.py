"""`python -m eval model`: a language model behind a Chat Completions endpoint, acting through tool
calls, graded with the scripted policies beside it (`eval.models.arm` runs it; `agents.model` is
the model's policy). Its options are the model's `ModelConfig`, field for field; `--regimes`
grades it under several regimes and draws the authority curve (`eval.models.regimes`)."""

from __future__ import annotations

import argparse
import time

from agents.model import (DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_MAX_TRANSCRIPT_BYTES, REGIMES,
                          ModelConfig)
from finality_gym import PROBE_ARMS, SPLITS

from eval.grading.options import finished, run_options
from eval.models import arm, regimes


def _param(text: str) -> tuple[str, str]:
    """`--param KEY=JSON` as (KEY, JSON); ModelConfig checks the value."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--param {text}: expected KEY=JSON, e.g. reasoning_effort='\"low\"'")
    return key, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_options(parser, "model", seeds=1)
    parser.add_argument("--model", required=True, help="the model's name at the endpoint")
    parser.add_argument("--base-url", required=True,
                        help="the OpenAI-compatible endpoint, e.g. http://localhost:11434/v1")
    parser.add_argument("--api-key-env", default=None,
                        help="the environment variable holding the API key (none for local "
                             "servers)")
    parser.add_argument("--split", choices=list(SPLITS), default="public")
    parser.add_argument("--subset", choices=("stratified", "all"), default="stratified",
                        help="48 stratified tasks (default) or the whole split")
    parser.add_argument("--probe", choices=list(PROBE_ARMS), default="full")
    parser.add_argument("--concurrency", type=int, default=1, help="episodes in flight (threads)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--regime", choices=list(REGIMES), default="open",
                       help="the model's authority: open (it decides), procedure (a written "
                            "operating procedure in the prompt), guarded (the guard refuses an "
                            "irreversible call the evidence does not support); pinned in run.json")
    which.add_argument("--regimes", default=None, metavar="R1,R2,...",
                       help="grade under each regime (e.g. open,procedure,guarded) into "
                            "OUT/REGIME on the same episodes, and draw the authority curve "
                            "(OUT/curve.md, OUT/authority_curve.png)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--price-in", type=float, default=None,
                        help="dollars per million prompt tokens: each episode's cost in its row")
    parser.add_argument("--price-out", type=float, default=None,
                        help="dollars per million completion tokens (reasoning tokens included)")
    parser.add_argument("--max-cost", type=float, default=None,
                        help="dollars: no episode starts once the run has spent this (exit 3; "
                             "re-run with a larger budget to go on)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=JSON",
                        help="one more request field, repeatable: reasoning_effort='\"low\"', "
                             "top_p=0.9, seed=7 (pinned in run.json)")
    parser.add_argument("--no-param", action="append", default=[], metavar="KEY",
                        help="a field never sent, repeatable: temperature, max_tokens (pinned)")
    parser.add_argument("--max-tokens", type=int, default=1024, help="per response")
    parser.add_argument("--max-total-tokens", type=int, default=None,
                        help="per episode; reaching it lapses the case (agent_status token_cap)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds: a deadline for each request attempt as a whole (connecting, "
                             "sending, reading), not for each read; past it the attempt is cut and "
                             "retried (default 120)")
    parser.add_argument("--max-retries", type=int, default=6, help="per request, for transient errors")
    parser.add_argument("--max-response-bytes", type=int, default=DEFAULT_MAX_RESPONSE_BYTES,
                        metavar="N", help="bytes a response may take over the wire, headers "
                        "included; reading stops past it and the attempt is retried (default "
                        f"{DEFAULT_MAX_RESPONSE_BYTES}, 8 MiB)")
    parser.add_argument("--max-transcript-bytes", type=int, default=DEFAULT_MAX_TRANSCRIPT_BYTES,
                        metavar="N", help="bytes an episode's transcript may take; past it the "
                        "episode is not graded (exit 3; re-run with a larger cap to complete it) "
                        f"(default {DEFAULT_MAX_TRANSCRIPT_BYTES}, 64 MiB)")


def main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    config = ModelConfig(model=args.model, base_url=args.base_url,
                         api_key_env=args.api_key_env, temperature=args.temperature,
                         max_tokens=args.max_tokens,
                         max_total_tokens=args.max_total_tokens, timeout_s=args.timeout,
                         params=tuple(_param(text) for text in args.param),
                         no_params=tuple(args.no_param), price_in=args.price_in,
                         price_out=args.price_out, max_cost=args.max_cost,
                         max_retries=args.max_retries,
                         max_response_bytes=args.max_response_bytes,
                         max_transcript_bytes=args.max_transcript_bytes, regime=args.regime)
    options = dict(split=args.split, subset=args.subset, seeds=args.seeds, probe=args.probe,
                   concurrency=args.concurrency, workers=args.workers,
                   progress=not args.no_progress, backend=args.backend)
    if args.regimes is not None:
        regimes.run(args.out, config, regimes.parse_regimes(args.regimes), **options)
    else:
        arm.run(args.out, config, **options)
    return finished(args, started)
