"""TRL's ``rollout_func``: whole episodes played by a scheduler, with token ids, ``env_mask`` and rewards."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envsdk.client.sync import background_loop
from envsdk.env import RolloutRequest
from envsdk.integrations.trl._common import (
    EpisodeError,
    Message,
    _capacity_error,
)
from envsdk.integrations.trl.rewards import SUDOKU_REWARD_COMPONENTS
from envsdk.policies.base import PolicyOutput
from envsdk.policies.chat_tokens import continuation_ids
from envsdk.records import EVAL_KEY, record_line
from envsdk.rewards.parts import REWARD_PARTS
from envsdk.schedulers.base import MultiTurnScheduler, Trajectory
from envsdk.schedulers.coding import CodingScheduler
from envsdk.schedulers.gym import GYMScheduler
from envsdk.schedulers.sudoku import SudokuScheduler


@dataclass
class _TokenRecord:
    """A trajectory as the trainer sees it: prompt ids, then model and environment tokens."""

    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def extend(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None) -> None:
        self.completion_ids.extend(int(i) for i in ids)
        self.env_mask.extend([mask] * len(ids))
        # TRL's own tool loop gives tokens it did not sample logprob 0.0.
        self.logprobs.extend([float(lp) for lp in logprobs] if logprobs is not None else [0.0] * len(ids))


@dataclass
class _GenerationBatch:
    requests: list[tuple[list[int], int, asyncio.Future[tuple[list[int], list[float] | None]]]]


class _GenerationQueue:
    """Collects the trajectories' generation requests on the client loop into batches.

    A batch is handed to the trainer's thread when every running trajectory is waiting for
    the model (environment steps are done), so each model turn is one batched call. Its rows
    are in episode order, not in the order the environment steps happened to finish: the
    sampler draws row by row, so a seeded run samples the same tokens every time.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, work: queue.Queue[_GenerationBatch | None]) -> None:
        self.loop = loop
        self.work = work
        self.active = 0
        self.pending: list[tuple[int, list[int], int, asyncio.Future[tuple[list[int], list[float] | None]]]] = []
        self.in_flight = False
        self.failed: BaseException | None = None

    def enter(self) -> None:
        self.active += 1

    def leave(self) -> None:
        self.active -= 1
        self._maybe_flush()

    async def generate(self, episode: int, context: list[int], max_new_tokens: int) -> tuple[list[int], list[float] | None]:
        if self.failed is not None:
            raise EpisodeError(f"generation failed earlier in this batch: {self.failed!r}")
        future: asyncio.Future[tuple[list[int], list[float] | None]] = self.loop.create_future()
        self.pending.append((episode, context, max_new_tokens, future))
        self._maybe_flush()
        return await future

    def _maybe_flush(self) -> None:
        if not self.in_flight and self.pending and len(self.pending) >= self.active:
            self.pending.sort(key=lambda request: request[0])
            batch = _GenerationBatch([(context, limit, future) for _, context, limit, future in self.pending])
            self.pending = []
            self.in_flight = True
            self.work.put(batch)

    def deliver(self, batch: _GenerationBatch, results: list[tuple[list[int], list[float] | None]] | BaseException) -> None:
        self.in_flight = False
        for i, (_, _, future) in enumerate(batch.requests):
            if future.done():
                continue
            if isinstance(results, BaseException):
                future.set_exception(EpisodeError(f"generation failed: {results!r}"))
            else:
                future.set_result(results[i])
        if isinstance(results, BaseException):
            self.failed = results
        self._maybe_flush()


class _TokenPolicy:
    """The policy of one trajectory: generates through the queue and records exact token ids.

    The first call templates the conversation into the prompt ids. Each later call appends
    the messages the scheduler added since the last reply (the environment's observation) as
    environment tokens, rendered the way the chat template renders them after an end of turn,
    followed by the generation prompt. A reply cut by the completion budget reports
    ``finish_reason="length"``: the scheduler's ``cut_replies`` rule deals with it, and the
    trajectory ends there.
    """

    def __init__(
        self, rollout: EnvironmentRollout, queue_: _GenerationQueue, episode: int, record: _TokenRecord, budget: int
    ) -> None:
        self.rollout = rollout
        self.queue = queue_
        self.episode = episode
        self.record = record
        self.budget = budget
        self.seen = 0

    async def act_ex(self, messages: list[Message]) -> PolicyOutput:
        record = self.record
        if not record.prompt_ids:
            record.prompt_ids = self.rollout.template(messages, add_generation_prompt=True)
        else:
            suffix = self.rollout.suffix_ids(messages[self.seen :])
            if len(record.completion_ids) + len(suffix) >= self.budget:
                return PolicyOutput(text="", finish_reason="length")
            record.extend(suffix, 0, None)
        room = self.budget - len(record.completion_ids)
        if self.rollout.max_turn_tokens is not None:
            room = min(room, self.rollout.max_turn_tokens)
        if room < 1:
            return PolicyOutput(text="", finish_reason="length")
        ids, logprobs = await self.queue.generate(self.episode, record.prompt_ids + record.completion_ids, room)
        record.extend(ids, 1, logprobs)
        # The scheduler appends this reply as an assistant message; what follows it is news.
        self.seen = len(messages) + 1
        stopped = bool(ids) and ids[-1] in self.rollout.eos_ids
        text = self.rollout.tokenizer.decode(ids, skip_special_tokens=True)
        return PolicyOutput(
            text=str(text),
            finish_reason="stop" if stopped else "length",
            prompt_tokens=len(record.prompt_ids),
            completion_tokens=len(ids),
        )

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text


class EnvironmentRollout:
    """TRL's ``rollout_func``: ``rollout(prompts, trainer) -> dict`` (see `make_rollout_func`).

    ``last_trajectories`` keeps the previous call's trajectories (for logging them with
    `TrajectoryWriter`, or inspecting them).
    """

    def __init__(
        self,
        scheduler: MultiTurnScheduler,
        *,
        components: Sequence[str] | None = None,
        max_concurrency: int | None = None,
        max_turn_tokens: int | None = None,
        seed: int = 0,
        env_config_fn: Callable[[list[Message], int], dict[str, Any]] | None = None,
        completions: str | Path | None = None,
        env_name: str | None = None,
    ) -> None:
        if max_turn_tokens is not None and max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1, got {max_turn_tokens}")
        self.scheduler = scheduler
        self.components: tuple[str, ...] = (
            tuple(components)
            if components is not None
            else (SUDOKU_REWARD_COMPONENTS if isinstance(scheduler, SudokuScheduler) else ())
        )
        self.max_concurrency = max_concurrency
        self.max_turn_tokens = max_turn_tokens
        self.seed = seed
        self.env_config_fn = env_config_fn
        self.env_name = env_name if env_name is not None else _env_name(scheduler)
        self.last_trajectories: list[Trajectory] = []
        self.completions = Path(completions) if completions is not None else None
        self._completions_begun = False
        self._groups_seen = 0
        self.tokenizer: Any = None
        self.eos_ids: frozenset[int] = frozenset()
        self._template_kwargs: dict[str, Any] = {}
        self._with_logprobs = False

    def _write_completions(self, path: Path, trajectories: list[Trajectory], step: int) -> None:
        """Each episode's record (``completions.jsonl``'s schema) with ``global_step``, the
        training step it feeds (what ``envsdk report`` plots a training curve over): the file is
        rewritten by the run's first call, then appended to, and closed after each call so that
        a run that dies keeps every finished step."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a" if self._completions_begun else "w", encoding="utf-8") as out:
            for trajectory in trajectories:
                out.write(record_line({**trajectory.to_dict(), "global_step": step}))
        self._completions_begun = True

    # ------------------------------------------------------------ tokens

    def template(self, messages: list[Message], *, add_generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False, **self._template_kwargs
        )
        return [int(i) for i in ids]

    def suffix_ids(self, new_messages: list[Message]) -> list[int]:
        """Tokens of `new_messages` as they follow a finished turn, plus the generation prompt
        (`envsdk.policies.chat_tokens.continuation_ids`)."""
        return continuation_ids(self.tokenizer, list(new_messages), self.eos_ids, **self._template_kwargs)

    # ------------------------------------------------------------ the call

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        self._bind(trainer)
        group = int(trainer.num_generations if trainer.model.training else trainer.num_generations_eval)
        if len(prompts) % group:
            raise ValueError(f"rollout_func got {len(prompts)} prompts, not a multiple of num_generations={group}")
        processes = int(getattr(getattr(trainer, "accelerator", None), "num_processes", 1) or 1)
        process_index = int(getattr(getattr(trainer, "accelerator", None), "process_index", 0) or 0)
        if processes > 1 and getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_mode", None) == "server":
            raise NotImplementedError(
                "make_rollout_func with vLLM server mode supports one training process: its generation calls are "
                "collective across processes and the number of model turns differs between them. Use "
                "vllm_mode='colocate' for several processes."
            )
        requests: list[RolloutRequest] = []
        for start in range(0, len(prompts), group):
            members = prompts[start : start + group]
            if any(p != members[0] for p in members):
                raise ValueError(
                    "rollout_func expects each prompt repeated num_generations times in a row (TRL's grouping); "
                    f"prompts {start}..{start + group - 1} differ"
                )
            messages = _as_messages(members[0])
            group_number = self._groups_seen * processes + process_index
            self._groups_seen += 1
            env_config = (
                self.env_config_fn(messages, self.seed + group_number)
                if self.env_config_fn is not None
                else {"seed": self.seed + group_number}
            )
            if self.env_name is not None and "name" not in env_config:
                env_config = {"name": self.env_name, **env_config}
            # The group GRPO compares, named in each record as an evaluation run names its
            # examples: `envsdk report` then counts the groups whose rewards do not vary.
            example = f"group-{group_number}"
            for index in range(len(members)):
                data = {"env_config": dict(env_config), EVAL_KEY: {"example": example, "index": index}}
                requests.append(RolloutRequest(messages=list(messages), data_dict=data, uuid=f"{example}/{index}"))
        budget = int(trainer.max_completion_length)
        trajectories, records = self._run(requests, trainer, budget)
        self.last_trajectories = trajectories
        if self.completions is not None:
            step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0) + 1
            path = self.completions if processes == 1 else self.completions.with_suffix(f".rank{process_index}.jsonl")
            self._write_completions(path, trajectories, step)
        for trajectory in trajectories:
            if trajectory.error_kind == "CapacityError":
                needed = min(len(requests), self.max_concurrency or len(requests)) * processes
                raise _capacity_error(
                    trajectory,
                    self.scheduler,
                    needed,
                    f"{min(len(requests), self.max_concurrency or len(requests))} episodes at once per process "
                    f"(the generation batch, or max_concurrency) on each of {processes} process(es)",
                )
        return self._output(prompts, trajectories, records)

    def _bind(self, trainer: Any) -> None:
        processing = trainer.processing_class
        tokenizer = getattr(processing, "tokenizer", processing)
        self.tokenizer = tokenizer
        self._template_kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
        eos = getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id]
        self.eos_ids = frozenset(int(t) for t in eos if t is not None)
        # Only vLLM reports the sampler's logprobs; the transformers path gives none.
        self._with_logprobs = bool(getattr(trainer, "use_vllm", False))

    def _run(self, requests: list[RolloutRequest], trainer: Any, budget: int) -> tuple[list[Trajectory], list[_TokenRecord]]:
        """Run every episode on the client loop; serve their generation batches in this thread
        (the trainer's, where the model and vLLM live)."""
        loop = background_loop()
        work: queue.Queue[_GenerationBatch | None] = queue.Queue()
        gen_queue = _GenerationQueue(loop, work)
        trajectories = [Trajectory(request=r) for r in requests]
        records = [_TokenRecord() for _ in requests]

        async def drive() -> None:
            gate = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None

            async def one(episode: int, trajectory: Trajectory, record: _TokenRecord) -> None:
                policy = _TokenPolicy(self, gen_queue, episode, record, budget)
                if gate is not None:
                    await gate.acquire()
                gen_queue.enter()
                try:
                    await self.scheduler.run_trajectory(trajectory, policy)
                finally:
                    gen_queue.leave()
                    if gate is not None:
                        gate.release()

            try:
                await asyncio.gather(*(one(i, t, r) for i, (t, r) in enumerate(zip(trajectories, records))))
            finally:
                work.put(None)

        driver = asyncio.run_coroutine_threadsafe(drive(), loop)
        failure: BaseException | None = None
        while True:
            try:
                batch = work.get(timeout=0.5)
            except queue.Empty:
                if driver.done():
                    break
                continue
            if batch is None:
                break
            try:
                results: list[tuple[list[int], list[float] | None]] | BaseException = self._generate(trainer, batch)
            except Exception as exc:  # noqa: BLE001 - handed to the episodes, which end and close; re-raised below
                results = exc
                failure = exc
            loop.call_soon_threadsafe(gen_queue.deliver, batch, results)
        driver.result()
        if failure is not None:
            raise failure
        return trajectories, records

    def _generate(self, trainer: Any, batch: _GenerationBatch) -> list[tuple[list[int], list[float] | None]]:
        """One batched model turn with the trainer's own generation path (vLLM or its model),
        capped at the largest budget in the batch and cut to each request's own."""
        contexts = [context for context, _, _ in batch.requests]
        cap = max(limit for _, limit, _ in batch.requests)
        with _max_new_tokens(trainer, cap):
            completion_ids, logprobs = trainer._generate_single_turn(contexts, None, {}, 1)
        results: list[tuple[list[int], list[float] | None]] = []
        for i, (_, limit, _) in enumerate(batch.requests):
            ids = [int(t) for t in completion_ids[i]][:limit]
            lps = None if logprobs is None else [float(lp) for lp in logprobs[i]][:limit]
            results.append((ids, lps))
        return results

    def _output(self, prompts: list[Any], trajectories: list[Trajectory], records: list[_TokenRecord]) -> dict[str, list[Any]]:
        eos = self.tokenizer.eos_token_id
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            "env_reward": [],
            "env_status": [],
            "truncated": [],
            REWARD_PARTS: [],
        }
        for name in self.components:
            out[name] = []
        for prompt, trajectory, record in zip(prompts, trajectories, records):
            if not record.prompt_ids:
                # The episode ended before the model's first turn (a reset error): a placeholder
                # row the loss ignores (its one token is masked) and the rewards leave out.
                record.prompt_ids = self.template(_as_messages(prompt), add_generation_prompt=True)
            if not record.completion_ids:
                record.extend([eos if eos is not None else 0], 0, None)
            failed = trajectory.status == "error"
            if trajectory.truncated and trajectory.rollout_infos.get("cut_replies") == "mask":
                # Kept in the batch (its reward stays in its group, as TRL's own
                # mask_truncated_completions keeps it) but out of the loss: no token is the model's.
                record.env_mask = [0] * len(record.env_mask)
            out["prompt_ids"].append(record.prompt_ids)
            out["completion_ids"].append(record.completion_ids)
            out["logprobs"].append(record.logprobs)
            out["env_mask"].append(record.env_mask)
            out["env_reward"].append(None if failed else float(trajectory.total_reward))
            out["env_status"].append(trajectory.status)
            out["truncated"].append(trajectory.truncated)
            infos = trajectory.rollout_infos
            parts = infos.get(REWARD_PARTS)
            out[REWARD_PARTS].append(None if failed else dict(parts) if isinstance(parts, dict) else {})
            for name in self.components:
                value = infos.get(name)
                # An episode cut before its first step has no components yet: they are 0, as its total is.
                out[name].append(None if failed else float(value) if isinstance(value, (int, float)) else 0.0)
        if not self._with_logprobs:
            out["logprobs"] = None  # type: ignore[assignment]
        return out


class _max_new_tokens:
    """Temporarily caps the trainer's generation length (transformers and vLLM paths)."""

    def __init__(self, trainer: Any, cap: int) -> None:
        self.trainer = trainer
        self.cap = cap
        self.saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> None:
        config = getattr(self.trainer, "generation_config", None)
        if config is not None and getattr(config, "max_new_tokens", None) is not None:
            self.saved.append((config, "max_new_tokens", config.max_new_tokens))
            config.max_new_tokens = min(self.cap, config.max_new_tokens)
        vllm = getattr(self.trainer, "vllm_generation", None) if getattr(self.trainer, "use_vllm", False) else None
        if vllm is not None:
            self.saved.append((vllm, "max_completion_length", vllm.max_completion_length))
            vllm.max_completion_length = min(self.cap, vllm.max_completion_length)

    def __exit__(self, *exc_info: object) -> None:
        for obj, name, value in reversed(self.saved):
            setattr(obj, name, value)
        self.saved.clear()


def _env_name(scheduler: MultiTurnScheduler) -> str | None:
    """The name `envsdk rollout --env` gives the environment `scheduler` plays, where the
    scheduler says: a local env's (`GYMScheduler.gym_env`), ``sudoku`` or ``coding``."""
    if isinstance(scheduler, GYMScheduler):
        return scheduler.gym_env
    if isinstance(scheduler, SudokuScheduler):
        return "sudoku"
    return "coding" if isinstance(scheduler, CodingScheduler) else None


def _as_messages(prompt: Any) -> list[Message]:
    if isinstance(prompt, list):
        return [dict(m) for m in prompt]
    return [{"role": "user", "content": str(prompt)}]


def make_rollout_func(
    scheduler: MultiTurnScheduler,
    *,
    components: Sequence[str] | None = None,
    max_concurrency: int | None = None,
    max_turn_tokens: int | None = None,
    seed: int = 0,
    env_config_fn: Callable[[list[Message], int], dict[str, Any]] | None = None,
    completions: str | Path | None = None,
    env_name: str | None = None,
) -> EnvironmentRollout:
    """A TRL ``rollout_func`` that plays one `scheduler` episode per prompt.

    Contract with ``GRPOTrainer``: `prompts` arrive in consecutive groups of
    ``num_generations`` equal prompts; the rows of a group share one ``env_config`` — by
    default ``{"seed": seed + n}`` for the n-th group (counted over the run, interleaved over
    processes), or ``env_config_fn(prompt_messages, seed + n)``, with `env_name` as its ``name``. The episode's first messages
    come from the scheduler's reset (the dataset prompt is replaced, as ms-swift's GYM
    scheduler does). It returns, one row per prompt:

    * ``prompt_ids`` — the templated first messages; ``completion_ids`` — every model turn
      and, between turns, the environment's messages as tokens; ``env_mask`` — 1 on the model's
      tokens, 0 on the environment's (kept in context, masked from the loss);
    * ``logprobs`` — the sampler's per-token logprobs (0.0 on environment tokens) with vLLM,
      None with the trainer's model;
    * ``env_reward`` — the episode's ``total_reward``; ``env_status``; ``truncated`` — whether
      the completion budget (or ``max_turn_tokens``) cut the episode's last reply, which the
      scheduler's ``cut_replies`` rule then dealt with: under ``"mask"`` the row's ``env_mask``
      is all 0, so the loss leaves it out (TRL's ``mask_truncated_completions``, per episode);
      ``reward_parts`` — the
      episode's value of each named reward part (``rollout_infos["reward_parts"]``: any
      environment's rubric parts, Sudoku's five), read by `reward_component_funcs`; and each
      of `components` (default: Sudoku's five for a `SudokuScheduler`) as a field of its own.
      An episode that failed gets None (NaN: left out of its group's baseline).

    The completion (model and environment tokens) is capped at the trainer's
    ``max_completion_length``; each model turn additionally at `max_turn_tokens`. At most
    `max_concurrency` episodes (default: all of the batch) hold a session at once; a server at
    capacity raises `EnvironmentCapacityError`.

    `completions` (a path): every episode's record is written there as it trains, with the
    ``global_step`` it feeds, for ``envsdk report`` (one file per process when there are several).
    Each record names its GRPO group as an evaluation run names its examples (``eval``:
    ``{"example": "group-N", "index": i}``), so that ``envsdk report`` gives each group's
    spread and the share of groups whose rewards do not vary (GRPO learns nothing from those),
    and ``envsdk show --example group-N`` prints one group. `env_name` (the record's ``env``) is
    put in each ``env_config`` that names none; default: what the scheduler plays
    (`GYMScheduler.gym_env`, ``sudoku``, ``coding``), else none.
    """
    return EnvironmentRollout(
        scheduler,
        components=components,
        max_concurrency=max_concurrency,
        max_turn_tokens=max_turn_tokens,
        seed=seed,
        env_config_fn=env_config_fn,
        completions=completions,
        env_name=env_name,
    )

