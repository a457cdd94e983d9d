"""Multi-turn rollouts: episodes whose environment answers each assistant reply.

A multi-turn environment (`Environment.multi_turn`: a verifiers package's own `vf.Env`, run in
the verifiers bridge) asks for one assistant reply at a time. `run_episodes` answers them in
rounds: every pending turn of every running episode of the call is sampled in one call of the
rollout backend, the replies go back to the environment, and the next round holds the turns
that follow, until every episode is over.

One episode is one token sequence, built token-in/token-out: the first prompt (the chat
template's rendering of the opening messages, with the generation prompt, and of the turn's
`tools` when a tool-using taskset's request names them), then each sampled
reply's tokens exactly as sampled (never re-tokenized), each followed by the environment's turn:
the tokens by which the template's rendering of the conversation with that turn (and the next
generation prompt) extends its rendering of the conversation up to the reply, as prime-rl and
verifiers build multi-turn sequences. The template closes an assistant message with its end
token and whatever follows it (ChatML's `<|im_end|>` and a newline): a reply that was sampled up
to a stop token gets only what follows it, a truncated reply gets the end token too, so the
sequence reads as the template would render the conversation. Sampled tokens carry the
sampler's log-probabilities and `loss_mask` 1; the environment's tokens carry 0.0 and mask 0,
so they never enter the loss, the importance ratio, the KL estimate or the filters' counts.

Bounds: the backend's context length (a turn whose sequence would not leave room for one
sampled token is refused, `context_length`, and the episode ends as verifiers ends a refused
turn); `[sampling] max_tokens` per reply; and the `[[env]]` caps `max_turns`,
`max_input_tokens` and `max_output_tokens`, enforced by the environment's side as verifiers'
`RolloutLimits` does (per episode and agent, soft by one turn).

A tool-using verifiers taskset's turns arrive the same way: its conversation holds the tool
results as `tool` messages after the reply that called them (the reply as sampled), so they are
environment tokens, masked out of the loss like any environment turn.

Agents the environment marks untrainable (user-sim's user) are answered by the same policy in
the same rounds; their tokens are not part of any rollout.

Deadline: the `[[env]] timeout` is verifiers' episode deadline (`Env.run_episode`'s
`timeout.episode`, wall-clock from the episode's start, the policy's sampling included). An
episode past it ends as verifiers ends it: cancelled, its agent's exchange in flight abandoned
unscored, flagged timed out. Like a failed episode it is run again from its start while
`[[env]] retries` last (verifiers' episode retries take timeouts too); past them it stays in its
group as a timed-out rollout: reward 0 and no function scored (verifiers scored nothing), its
tokens up to the deadline, `Completion.timed_out` set, which keeps it out of the advantages and
the loss (engine/trainer.py) and counts it in `is_timeout/mean`.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from engine.environments.base import EnvironmentFailed, Example, retry_allowed
from engine.rollout import Completion

logger = logging.getLogger("engine")


def render(tokenizer, messages: list[dict], *, generation_prompt: bool, template_kwargs: dict) -> list[int]:
    """The chat template's token ids of `messages` (with the assistant generation prompt or not)."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False, **template_kwargs
    )
    return list(ids)


def environment_turn_tokens(
    tokenizer, previous: list[dict], messages: list[dict], *, stop_token_ids, ended_with_stop: bool, template_kwargs: dict,
) -> list[int]:
    """Return the tokens that follow a sampled reply in the episode's sequence: the rest of the
    template's closing of the assistant message, then the environment's turn and the next
    generation prompt (the module docstring says how).

    `previous`: the conversation up to and including the reply (its text, as the environment
    saw it); `messages`: that conversation and the environment's turn after it;
    `ended_with_stop`: whether the reply's last sampled token is a stop token. Raises
    EnvironmentFailed when the template renders `previous` differently once the turn is added
    (a template that rewrites earlier turns cannot extend a token sequence).
    """
    before = render(tokenizer, previous, generation_prompt=False, template_kwargs=template_kwargs)
    after = render(tokenizer, messages, generation_prompt=True, template_kwargs=template_kwargs)
    if after[: len(before)] != before:
        raise EnvironmentFailed(
            "the model's chat template renders earlier turns differently once a later turn is added; "
            "a multi-turn episode cannot extend its token sequence with it"
        )
    stops = set(stop_token_ids)
    ends = [index for index, token in enumerate(before) if token in stops]
    closing = []
    if ends:
        closing = before[ends[-1] + 1:] if ended_with_stop else before[ends[-1]:]
    return closing + after[len(before):]


@dataclass
class EpisodeRollout:
    """One finished episode as a rollout: `prompt_ids` (its first prompt), `completion` (every
    token after it, `loss_mask` 1 on the sampled ones), `text` (the conversation after the
    opening messages, as `[role]` blocks), `reward` and `functions` (the environment's), `turns`
    (replies sampled for the trainable agent), `stop_condition` (what ended it:
    `episode_timeout` for an episode past its deadline) and `timed_out`."""

    prompt_ids: list[int]
    completion: Completion
    text: str
    reward: float
    functions: dict[str, float]
    turns: int
    stop_condition: str | None
    timed_out: bool = False


@dataclass
class _Episode:
    row: int
    prompt_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    opening: int = 0
    conversation: list[dict] = field(default_factory=list)
    ended_with_stop: bool = True
    truncated: bool = False
    turns: int = 0
    versions: set = field(default_factory=set)
    result: dict | None = None
    timed_out: bool = False


def transcript(messages: list[dict]) -> str:
    """`messages` as text blocks `[role]\\ncontent`, as verifiers' `Trace.transcript` writes them."""
    return "\n\n".join(f"[{message['role']}]\n{message['content']}" for message in messages)


def run_episodes(
    env, examples: list[Example], n: int, *, tokenizer, backend, stop_token_ids, context_length: int, max_tokens: int,
    temperature: float, seed: int, template_kwargs: dict, sampling: dict | None = None,
) -> list[EpisodeRollout]:
    """Run `n` episodes of each example on the multi-turn environment `env`, sampling every
    turn with `backend`; return the rollouts example by example, the `n` of each adjacent.

    Round r samples with seed `seed + r`. `sampling` holds extra keyword arguments for the
    backend's `generate` (`sampling_params`). An episode that fails (the environment's code
    raised, or it trained no agent or several) is run again from its start, up to `env.retries`
    times (`[[env]] retries`); raises EnvironmentFailed past them, and RuntimeError when a
    round's replies came from several policy versions. An episode past its deadline
    (`env.timeout`) is run again the same way and, past the retries, returned timed out
    (the module docstring).
    """
    with getattr(env, "episode_lock", contextlib.nullcontext()):
        return _run_episodes(
            env, examples, n, tokenizer=tokenizer, backend=backend, stop_token_ids=stop_token_ids,
            context_length=context_length, max_tokens=max_tokens, temperature=temperature, seed=seed,
            template_kwargs=template_kwargs, sampling=sampling,
        )


def _run_episodes(env, examples, n, *, tokenizer, backend, stop_token_ids, context_length, max_tokens, temperature,
                  seed, template_kwargs, sampling) -> list[EpisodeRollout]:
    task_ids = [example.info["task_id"] for example in examples for _ in range(n)]
    started = env.start_episodes(task_ids, env.limits)
    episodes = {episode_id: _Episode(row) for row, episode_id in enumerate(started["episodes"])}
    retried = [0] * len(task_ids)
    untrainable: dict[tuple[str, str], int] = {}
    answer, round_index = started, 0
    stops = set(stop_token_ids)
    while True:
        requests = _finish(env, episodes, answer, task_ids, retried)
        if not requests:
            break
        prompts, budgets, sampled_requests, answers = [], [], [], []
        for request in requests:
            episode = episodes[request["episode"]]
            turn = None
            # A tool-using taskset's turn names its tools, which the chat template renders.
            kwargs = {**template_kwargs, "tools": request["tools"]} if request.get("tools") else template_kwargs
            if request["trainable"]:
                try:
                    ids, turn = _next_sequence(episode, request["messages"], tokenizer, stop_token_ids, kwargs)
                except EnvironmentFailed as error:
                    raise EnvironmentFailed(f"environment {env.id}: {error}") from None
                fed = len(turn) if turn is not None else len(ids)
            else:
                ids = render(tokenizer, request["messages"], generation_prompt=True, template_kwargs=kwargs)
                key = (request["episode"], request["agent"])
                fed = max(0, len(ids) - untrainable.get(key, 0))
            room = context_length - len(ids)
            if room < 1:  # the turn is refused: its tokens never join the sequence
                if request["trainable"]:
                    episode.truncated = True
                answers.append({"request": request["request"], "stop": "context_length"})
                continue
            if turn is not None:
                episode.token_ids += turn
                episode.loss_mask += [0] * len(turn)
                episode.logprobs += [0.0] * len(turn)
            prompts.append(ids)
            budgets.append(min(max_tokens, room))
            sampled_requests.append((request, fed))
        if prompts:
            completions = backend.generate(
                prompts, n=1, max_tokens=max(budgets), temperature=temperature, seed=seed + round_index, **(sampling or {}),
            )
            for (request, fed), ids, budget, completion in zip(sampled_requests, prompts, budgets, completions):
                tokens, logprobs = completion.token_ids[:budget], completion.logprobs[:budget]
                ended_with_stop = bool(tokens) and tokens[-1] in stops
                text = tokenizer.decode(tokens, skip_special_tokens=True)
                if request["trainable"]:
                    episode = episodes[request["episode"]]
                    episode.token_ids += tokens
                    episode.loss_mask += [1] * len(tokens)
                    episode.logprobs += list(logprobs) if len(logprobs) == len(tokens) else [0.0] * len(tokens)
                    episode.ended_with_stop = ended_with_stop
                    episode.truncated = not ended_with_stop
                    episode.conversation = [*request["messages"], {"role": "assistant", "content": text}]
                    episode.turns += 1
                    episode.versions.add(completion.policy_version)
                else:
                    untrainable[(request["episode"], request["agent"])] = len(ids) + len(tokens)
                answers.append({"request": request["request"], "text": text, "input_tokens": fed, "output_tokens": len(tokens)})
        answer = env.reply(answers)
        round_index += 1
    rollouts = []
    # An episode refused before its first reply sampled nothing: it counts as the call's policy's.
    sampled_versions = set().union(*(episode.versions for episode in episodes.values()))
    fallback = sampled_versions or {getattr(backend, "policy_version", 0)}
    for episode in sorted(episodes.values(), key=lambda item: item.row):
        if episode.result is None:
            raise EnvironmentFailed(f"environment {env.id}: an episode never finished")
        if episode.prompt_ids is None and episode.timed_out and examples[episode.row // n].messages:
            # Past its deadline before its first reply: its task's opening, and nothing sampled.
            messages = examples[episode.row // n].messages
            episode.prompt_ids = render(tokenizer, messages, generation_prompt=True, template_kwargs=template_kwargs)
            episode.opening = len(messages)
        if episode.prompt_ids is None:
            raise EnvironmentFailed(f"environment {env.id}: an episode ended before its trainable agent's first turn")
        versions = set(episode.versions or fallback)
        if len(versions) != 1:
            raise RuntimeError(f"an episode's turns came from policy versions {sorted(versions)}")
        rollouts.append(EpisodeRollout(
            prompt_ids=episode.prompt_ids,
            completion=Completion(
                token_ids=episode.token_ids, logprobs=episode.logprobs, truncated=episode.truncated,
                policy_version=versions.pop(), loss_mask=episode.loss_mask, timed_out=episode.timed_out,
            ),
            text=transcript(episode.conversation[episode.opening:]),
            reward=float(episode.result["reward"]),
            functions={name: float(value) for name, value in episode.result["functions"].items()},
            turns=episode.turns,
            stop_condition=episode.result.get("stop_condition"),
            timed_out=episode.timed_out,
        ))
    return rollouts


def _next_sequence(episode: _Episode, messages: list[dict], tokenizer, stop_token_ids, template_kwargs) -> tuple[list[int], list[int] | None]:
    """Return the sequence to sample the episode's next reply from and the environment's turn
    tokens it adds (None for the first turn, whose prompt becomes the episode's `prompt_ids`);
    the caller appends the turn once it fits the context."""
    if episode.prompt_ids is None:
        episode.prompt_ids = render(tokenizer, messages, generation_prompt=True, template_kwargs=template_kwargs)
        episode.opening = len(messages)
        return episode.prompt_ids, None
    previous = episode.conversation
    if messages[: len(previous)] != previous or len(messages) == len(previous):
        raise EnvironmentFailed("an episode's conversation changed its earlier turns; a token sequence cannot follow it")
    turn = environment_turn_tokens(
        tokenizer, previous, messages, stop_token_ids=stop_token_ids, ended_with_stop=episode.ended_with_stop,
        template_kwargs=template_kwargs,
    )
    return episode.prompt_ids + episode.token_ids + turn, turn


def _finish(env, episodes: dict[str, _Episode], answer: dict, task_ids: list[str], retried: list[int]) -> list[dict]:
    """Record the results of the episodes that `answer` (the environment's answer to a start or
    a reply) says ended, and return the turn requests to sample next. A failed or timed-out
    episode is started again from scratch, as a new episode in its row, while `env.retries`
    allows (`retried` counts each row's retries); its requests join the returned ones. Raises
    EnvironmentFailed for a failure past the retries; an episode that timed out past them is
    recorded timed out (reward 0, no function scored)."""
    requests, pending = list(answer["requests"]), list(answer["finished"])
    while pending:
        result = pending.pop(0)
        if not result.get("error"):
            episodes[result["episode"]].result = result
            continue
        row = episodes[result["episode"]].row
        if result.get("timeout"):
            message = f"environment {env.id}: {result['error']}"
            if not retry_allowed(env, retried[row], message, "an episode", outcome="timed out"):
                episode = episodes[result["episode"]]
                episode.result = {"reward": 0.0, "functions": {}, "stop_condition": "episode_timeout"}
                episode.timed_out = True
                logger.info("an episode timed out (%s); it counts as a timed-out rollout", message)
                continue
        else:
            error = EnvironmentFailed(f"environment {env.id}: an episode failed: {result['error']}")
            if not retry_allowed(env, retried[row], error, "an episode"):
                raise error
        del episodes[result["episode"]]
        retried[row] += 1
        again = env.start_episodes([task_ids[row]], env.limits)
        (episode_id,) = again["episodes"]
        episodes[episode_id] = _Episode(row)
        requests += again["requests"]
        pending += again["finished"]
    # An episode that ended (failed, or past its deadline) may have asked for a turn as it ended: nobody waits for it.
    return [request for request in requests if request["episode"] in episodes and episodes[request["episode"]].result is None]


def group_rollouts(rollouts: list[EpisodeRollout]) -> tuple[list[int], list[Completion]]:
    """Return one GRPO group's shared prompt and its completions: the longest common prefix of
    the episodes' first prompts (all of it when every episode opened alike; a conversation the
    environment opens differently per episode shares less), and each episode's tokens after it,
    the rest of its own first prompt masked out of the loss. Raises EnvironmentFailed when the
    prompts share no token."""
    shared = min(len(rollout.prompt_ids) for rollout in rollouts)
    first = rollouts[0].prompt_ids
    for rollout in rollouts[1:]:
        shared = next((index for index in range(shared) if rollout.prompt_ids[index] != first[index]), shared)
    if shared == 0:
        raise EnvironmentFailed("the episodes of one task share no first prompt token; they cannot form a group")
    completions = []
    for rollout in rollouts:
        own = rollout.prompt_ids[shared:]
        completion = rollout.completion
        completions.append(Completion(
            token_ids=own + completion.token_ids,
            logprobs=[0.0] * len(own) + completion.logprobs,
            truncated=completion.truncated,
            policy_version=completion.policy_version,
            loss_mask=[0] * len(own) + list(completion.loss_mask or [1] * len(completion.token_ids)),
            timed_out=completion.timed_out,
        ))
    return first[:shared], completions


def complete_functions(functions: list[dict[str, float]], known: list[str] = ()) -> list[dict[str, float]]:
    """Give every rollout's scores the same names, `known` (the environment's reward functions)
    first: a reward an environment recorded on some episodes only, or a function that scored
    nothing (every episode timed out), counts 0 on the others (verifiers' `trace.reward` sums
    what was recorded)."""
    names = list(known)
    for scores in functions:
        names += [name for name in scores if name not in names]
    return [{name: scores.get(name, 0.0) for name in names} for scores in functions]
