"""finality-gym as a `verifiers` environment (v1 API), id `finality-gym-env`: one payment case
per task, the model acting through the benchmark's twelve tools, rewarded by the grader's gap.

    make verifiers     # .venv-verifiers: verifiers, finality-gym and this package
    .venv-verifiers/bin/vf-eval finality-gym-env -m MODEL --client.base-url URL \\
        --client.api-key-var VAR --env.agent.runtime.type subprocess --no-push \\
        [--env.taskset.split public|regenerated|private] [--env.taskset.master-seed-file F] \\
        [--env.taskset.subset stratified|all] [--env.taskset.seeds 1] [--env.taskset.probe full] \\
        [--env.taskset.archetypes A B ...] [--env.taskset.count N] \\
        [--env.taskset.regime open|procedure|guarded] [--env.taskset.max-requests 80] ...

A thin adapter: the cases, the episode, the reward and the metrics are
`eval/models/verifiers_cases.py`'s (which imports no verifiers), and docs/model-arm.md says what
they are. Here: the taskset (`FinalityTaskset`: one task per case, in the cases' keyed order
(`verifiers_cases.order_key`: no position tells a task, an archetype or a fate), its id opaque,
its prompt the arm's system prompt and brief, its data enough to rebuild the case in any
process, as a trainer's env server does), the task (`FinalityTask`: the reward and the metrics of the graded
row the episode left in `trace.info`), and the harness (`FinalityHarness`, this package's
default): it plays the episode in the environment's process, one engine per episode, with the
model arm's own policy and endpoint pointed at the rollout's interception endpoint, so the
requests, the tool schemas and the results are `python -m eval model`'s. An endpoint failure is
the rollout's error, never a scored episode.

May import: verifiers and, from the repository (whose root `.venv-verifiers` has on its path),
`eval.models.verifiers_cases`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import verifiers.v1 as vf

from eval.models import verifiers_cases as cases


class FinalityData(vf.TaskData):
    """A case as the wire carries it: an opaque id, the system prompt and the brief, and the
    taskset's options (the same for every case), from which any process rebuilds the case (a
    trainer's env server rebuilds a task from this data alone, never calling `load`)."""

    options: dict


def case_of(data: FinalityData) -> tuple[cases.CaseSet, cases.Case]:
    """The case a task's data names: its id among the cases its options declare."""
    case_set = cases.case_set(cases.Options.of(data.options))
    case = case_set.by_id().get(data.id)
    if case is None:
        raise ValueError(f"task {data.id!r} is not one of the cases its options declare")
    return case_set, case


class FinalityTask(vf.Task[FinalityData]):
    """One case; its reward and metrics are the grader's row's."""

    @vf.reward(weight=1.0)
    async def gap_reward(self, trace: vf.Trace) -> float:
        """order_value / (order_value + gap): 1 when exact (`verifiers_cases.reward`)."""
        return cases.reward(_row(trace))

    @vf.metric
    async def grade(self, trace: vf.Trace) -> dict:
        """exact, premature, gap_usd, money_loss, revenue_loss (`verifiers_cases.metrics`)."""
        return cases.metrics(_row(trace))


def _row(trace: vf.Trace) -> dict:
    row = trace.info.get("row")
    if not isinstance(row, dict):
        raise ValueError("the rollout left no graded row: its episode did not end (an endpoint "
                         "failure, or a verifiers limit such as --env.agent.max-turns stopped it)")
    return row


class FinalityConfig(vf.TasksetConfig):
    """The taskset's options (`verifiers_cases.Options`)."""

    split: str = "public"
    master_seed_file: str | None = None
    subset: str = "stratified"
    seeds: int = 1
    probe: str = "full"
    archetypes: list[str] | None = None
    count: int | None = None
    regime: str = "open"
    max_requests: int = 80
    max_invalid_turns: int = 8
    max_total_tokens: int | None = None


class FinalityTaskset(vf.Taskset[FinalityTask, FinalityConfig]):
    def load(self):
        case_set = cases.case_set(cases.Options.of(self.config.model_dump()))
        options = case_set.options.as_dict()
        for case in case_set.cases:
            system, brief = case_set.prompts(case)
            yield FinalityTask(FinalityData(id=case.id, prompt=brief, system_prompt=system,
                                            options=options), self.config.task)


class FinalityHarnessConfig(vf.HarnessConfig):
    threads: int = 32
    """Episodes played at once (each waits on the model in a thread of its own)."""


class FinalityHarness(vf.Harness[FinalityHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    NEEDS_CONTAINER = False  # the episode runs in this process; nothing runs in the runtime
    EXECUTES_CODE = False

    _pool: concurrent.futures.ThreadPoolExecutor | None = None

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):
        case_set, case = case_of(data)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.config.threads,
                                                               thread_name_prefix="finality")
        sampling = ctx.sampling
        row = await asyncio.get_running_loop().run_in_executor(
            self._pool, cases.play, case_set, case, ctx.model, endpoint, secret,
            sampling.temperature, sampling.max_tokens)
        trace.info.update(row=row, label=row["label"], env_version=cases.ENV_VERSION)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["FinalityTaskset", "FinalityHarness"]  # the harness: this taskset's default
