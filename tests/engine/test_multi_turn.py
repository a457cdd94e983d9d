"""Multi-turn rollouts as one token sequence (engine/multi_turn.py): sampled replies kept as
sampled, environment turns rendered by the chat template, and the environment's tokens out of
the loss, the importance ratio, the KL estimate and the filters' counts."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from engine.environments import EnvironmentFailed, Example
from engine.filters import Rollouts, apply_filters
from engine.grpo import grpo_loss, token_logprobs_and_entropy
from engine.models import stop_token_ids, tiny_random_llama
from engine.multi_turn import EpisodeRollout, complete_functions, environment_turn_tokens, group_rollouts, render, run_episodes
from engine.orchestrator import RolloutBatch
from engine.policy import completion_logits, pack_rollouts
from engine.roles import batch_from_json, batch_to_json
from engine.rollout import Completion, TransformersBackend

SYSTEM = {"role": "system", "content": "Reply with one number."}
PROMPT = {"role": "user", "content": "Guess it."}


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = tiny_random_llama()
    return model, tokenizer, stop_token_ids(model, tokenizer)


class ScriptedEnvironment:
    """A stand-in for the verifiers bridge's side of the protocol (the real bridge runs in
    tests/environments/test_verifiers_multi_turn.py): each episode answers every reply with
    "Higher." until it has `turns` replies."""

    id = "acme/scripted"
    multi_turn = True

    def __init__(self, turns: int):
        self.turns = turns
        self.limits = {"max_turns": None}
        self.conversations: dict[str, list[dict]] = {}
        self.requests: dict[str, str] = {}
        self.replies: dict[str, list[dict]] = {}
        self.started: list[str] = []
        self.retries = 0

    def start_episodes(self, task_ids, limits):
        episodes = [f"e{len(self.conversations) + index}" for index in range(len(task_ids))]
        self.started.extend(task_ids)
        for episode in episodes:
            self.conversations[episode] = [SYSTEM, PROMPT]
            self.replies[episode] = []
        return {"episodes": episodes, **self._round(episodes)}

    def reply(self, answers):
        episodes, finished = [], []
        for answer in answers:
            episode = self.requests.pop(answer["request"])
            self.replies[episode].append(answer)
            if "stop" in answer:  # a refused turn ends the exchange, as in the bridge
                finished.append({"episode": episode, "reward": 0.0, "functions": {"turns": 0.0}})
                continue
            self.conversations[episode].append({"role": "assistant", "content": answer["text"]})
            episodes.append(episode)
        answer = self._round(episodes)
        return {"requests": answer["requests"], "finished": finished + answer["finished"]}

    def _round(self, episodes):
        requests, finished = [], []
        for episode in episodes:
            if len(self.replies[episode]) == self.turns:
                finished.append({"episode": episode, "reward": float(len(self.replies[episode])), "functions": {"turns": 1.0}})
                continue
            if self.replies[episode]:
                self.conversations[episode].append({"role": "user", "content": "Higher."})
            request = f"r{len(self.requests) + sum(map(len, self.replies.values()))}-{episode}"
            self.requests[request] = episode
            requests.append({"request": request, "episode": episode, "agent": "player", "trainable": True,
                             "messages": list(self.conversations[episode])})
        return {"requests": requests, "finished": finished}


class FlakyEnvironment(ScriptedEnvironment):
    """A ScriptedEnvironment whose first `failures` episodes to reply fail after their first
    reply, as an episode whose environment code raised does in the bridge."""

    def __init__(self, turns: int, *, failures: int, retries: int):
        super().__init__(turns)
        self.failures, self.retries, self.failed = failures, retries, []

    def _round(self, episodes):
        failing = []
        for episode in episodes:
            if len(self.replies[episode]) == 1 and len(self.failed) + len(failing) < self.failures:
                failing.append(episode)
        self.failed += failing
        answer = super()._round([episode for episode in episodes if episode not in failing])
        errors = [{"episode": episode, "error": "RuntimeError: the referee left"} for episode in failing]
        return {"requests": answer["requests"], "finished": errors + answer["finished"]}


class RecordingBackend(TransformersBackend):
    """The real transformers backend, keeping every call's prompts and completions."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def generate(self, prompts, **kwargs):
        completions = super().generate(prompts, **kwargs)
        self.calls.append((prompts, kwargs, completions))
        return completions


def backend_for(tiny):
    model, tokenizer, stops = tiny
    return RecordingBackend(model, pad_token_id=tokenizer.pad_token_id, stop_token_ids=stops)


def sample(env, tiny, backend, *, n=2, examples=1, max_tokens=3, context_length=512, temperature=1.0):
    _, tokenizer, stops = tiny
    return run_episodes(
        env, [Example(messages=[], answer="", info={"task_id": f"train:0:{index}"}) for index in range(examples)], n,
        tokenizer=tokenizer, backend=backend, stop_token_ids=stops, context_length=context_length, max_tokens=max_tokens,
        temperature=temperature, seed=5, template_kwargs={},
    )


def test_it_keeps_sampled_tokens_as_sampled_and_masks_the_rendered_environment_turns(tiny):
    _, tokenizer, stops = tiny
    env, backend = ScriptedEnvironment(turns=3), backend_for(tiny)
    rollouts = sample(env, tiny, backend)

    assert len(backend.calls) == 3  # one sampling call per round, both episodes in it
    assert [len(prompts) for prompts, _, _ in backend.calls] == [2, 2, 2]
    first_prompt = render(tokenizer, [SYSTEM, PROMPT], generation_prompt=True, template_kwargs={})
    for row, rollout in enumerate(rollouts):
        assert rollout.prompt_ids == first_prompt
        assert rollout.turns == 3 and rollout.reward == 3.0
        completion = rollout.completion
        assert len(completion.token_ids) == len(completion.loss_mask) == len(completion.logprobs)
        # The sampled segments, in order, are exactly what the backend sampled, with its log-probabilities.
        sampled = [call[2][row] for call in backend.calls]
        assert completion.sampled_token_ids() == [token for segment in sampled for token in segment.token_ids]
        assert completion.sampled_logprobs() == [value for segment in sampled for value in segment.logprobs]
        # Every environment token has log-probability 0.0 and is masked out.
        assert all(value == 0.0 for value, kept in zip(completion.logprobs, completion.loss_mask) if not kept)
        # Each environment turn reads as the template renders it after a reply: the reply's end
        # token (only where the sampler did not sample it), the user's turn, the next generation prompt.
        turns, current = [], []
        for token, kept in zip(completion.token_ids, completion.loss_mask):
            if not kept:
                current.append(token)
            elif current:
                turns.append(current)
                current = []
        assert len(turns) == 2
        for segment, turn in zip(sampled, turns):
            ended = segment.token_ids[-1] in stops
            expected = ("\n" if ended else "<|im_end|>\n") + "<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"
            assert tokenizer.decode(turn, skip_special_tokens=False) == expected
        # The second and third calls sampled from exactly the sequence built so far.
        assert backend.calls[2][0][row] == rollout.prompt_ids + completion.token_ids[: len(backend.calls[2][0][row]) - len(rollout.prompt_ids)]


def test_a_failed_episode_runs_again_from_its_start_while_its_retries_last(tiny, caplog):
    env = FlakyEnvironment(turns=3, failures=2, retries=1)
    rollouts = sample(env, tiny, backend_for(tiny), n=2, examples=2)

    assert env.failed == ["e0", "e1"]  # both episodes of the first task, after their first reply
    # Started again, each as a new episode of its own task, in the rows they left.
    assert env.started == ["train:0:0", "train:0:0", "train:0:1", "train:0:1", "train:0:0", "train:0:0"]
    assert [(rollout.turns, rollout.reward) for rollout in rollouts] == [(3, 3.0)] * 4
    for rollout in rollouts:  # three sampled replies each, the failed episode's reply in none of them
        mask = rollout.completion.loss_mask
        assert sum(1 for i, kept in enumerate(mask) if kept and (i == 0 or not mask[i - 1])) == 3
    assert [record.getMessage().split(" failed")[0] for record in caplog.records if "running it again" in record.getMessage()] == ["an episode"] * 2


class StallingEnvironment(ScriptedEnvironment):
    """A ScriptedEnvironment whose first `stalls` episodes to reply run past their deadline after
    `replies` replies (0: before their first turn), answered as the bridge answers an episode
    verifiers timed out."""

    def __init__(self, turns: int, *, stalls: int, retries: int, replies: int = 1):
        super().__init__(turns)
        self.stalls, self.retries, self.at, self.stalled = stalls, retries, replies, []

    def _round(self, episodes):
        answer, timeouts = super()._round(episodes), []
        for request in answer["requests"]:  # the request stays: the engine must not sample it
            if len(self.replies[request["episode"]]) == self.at and len(self.stalled) < self.stalls:
                self.stalled.append(request["episode"])
                timeouts.append({"episode": request["episode"], "timeout": True,
                                 "error": "GuessEnv.run() exceeded its 2s deadline (--env.timeout.episode)"})
        return {"requests": answer["requests"], "finished": timeouts + answer["finished"]}


def test_an_episode_past_its_deadline_runs_again_while_its_retries_last_then_counts_as_timed_out(tiny, caplog):
    caplog.set_level(logging.INFO, logger="engine")
    env = StallingEnvironment(turns=3, stalls=1, retries=0)
    stalled, finished = sample(env, tiny, backend_for(tiny), n=2)
    assert env.stalled == ["e0"] and env.started == ["train:0:0"] * 2  # no retry
    assert (stalled.timed_out, stalled.completion.timed_out, stalled.reward, stalled.functions) == (True, True, 0.0, {})
    assert (stalled.stop_condition, stalled.turns) == ("episode_timeout", 1)
    assert (finished.timed_out, finished.turns, finished.reward) == (False, 3, 3.0)
    # The rollouts group as any others: the stalled one's tokens up to its deadline, flagged timed out.
    _, completions = group_rollouts([stalled, finished])
    assert [completion.timed_out for completion in completions] == [True, False]
    assert not [record for record in caplog.records if "running it again" in record.getMessage()]

    caplog.clear()
    env = StallingEnvironment(turns=3, stalls=1, retries=1)  # the retry finishes in time
    rollouts = sample(env, tiny, backend_for(tiny), n=2)
    assert env.started == ["train:0:0"] * 3
    assert [(rollout.timed_out, rollout.turns, rollout.reward) for rollout in rollouts] == [(False, 3, 3.0)] * 2
    assert [record.getMessage() for record in caplog.records if "running it again" in record.getMessage()] == [
        "an episode timed out (environment acme/scripted: GuessEnv.run() exceeded its 2s deadline "
        "(--env.timeout.episode)); running it again, retry 1 of 1"
    ]


def test_an_episode_past_its_deadline_before_its_first_turn_is_its_tasks_opening_and_nothing_sampled(tiny):
    _, tokenizer, _ = tiny
    env = StallingEnvironment(turns=2, stalls=1, retries=0, replies=0)
    examples = [Example(messages=[SYSTEM, PROMPT], answer="", info={"task_id": "train:0:0"})]
    _, _, stops = tiny
    stalled, finished = run_episodes(
        env, examples, 2, tokenizer=tokenizer, backend=backend_for(tiny), stop_token_ids=stops, context_length=512,
        max_tokens=3, temperature=1.0, seed=5, template_kwargs={},
    )
    assert stalled.timed_out and stalled.completion.token_ids == [] and stalled.text == ""
    assert stalled.prompt_ids == render(tokenizer, [SYSTEM, PROMPT], generation_prompt=True, template_kwargs={})
    assert stalled.prompt_ids == finished.prompt_ids and not finished.timed_out


def test_a_failure_past_the_retries_fails_the_episodes_call(tiny):
    with pytest.raises(EnvironmentFailed, match="acme/scripted: an episode failed: RuntimeError: the referee left"):
        sample(FlakyEnvironment(turns=3, failures=1, retries=0), tiny, backend_for(tiny), n=1)
    env = FlakyEnvironment(turns=3, failures=2, retries=1)  # the retry fails too
    with pytest.raises(EnvironmentFailed, match="the referee left"):
        sample(env, tiny, backend_for(tiny), n=1)
    assert env.failed == ["e0", "e1"] and env.started == ["train:0:0", "train:0:0"]


def test_environment_turn_tokens_equal_the_template_rendering_of_the_conversation(tiny):
    _, tokenizer, stops = tiny
    reply = "42"
    previous = [SYSTEM, PROMPT, {"role": "assistant", "content": reply}]
    messages = [*previous, {"role": "user", "content": "Lower."}]
    prompt = render(tokenizer, [SYSTEM, PROMPT], generation_prompt=True, template_kwargs={})
    sampled = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    turn = environment_turn_tokens(tokenizer, previous, messages, stop_token_ids=stops, ended_with_stop=True, template_kwargs={})
    # When the reply's tokens are the template's own, the sequence is the rendering of the conversation.
    assert prompt + sampled + turn == render(tokenizer, messages, generation_prompt=True, template_kwargs={})
    truncated = environment_turn_tokens(tokenizer, previous, messages, stop_token_ids=stops, ended_with_stop=False, template_kwargs={})
    assert truncated == [tokenizer.eos_token_id] + turn


def test_a_template_that_rewrites_earlier_turns_is_refused(tiny):
    _, tokenizer, stops = tiny
    copied = copy.deepcopy(tokenizer)
    # Shows only the last assistant message: adding a turn changes how the earlier ones render.
    copied.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    previous = [PROMPT, {"role": "assistant", "content": "1"}]
    with pytest.raises(EnvironmentFailed, match="renders earlier turns differently"):
        environment_turn_tokens(copied, previous, [*previous, {"role": "user", "content": "Higher."}],
                                stop_token_ids=stops, ended_with_stop=True, template_kwargs={})


def test_a_turn_that_would_not_fit_the_context_ends_the_episode(tiny):
    _, tokenizer, _ = tiny
    env, backend = ScriptedEnvironment(turns=50), backend_for(tiny)
    prompt = render(tokenizer, [SYSTEM, PROMPT], generation_prompt=True, template_kwargs={})
    context = len(prompt) + 40
    (rollout,) = sample(env, tiny, backend, n=1, max_tokens=8, context_length=context)
    # The refused turn was answered with a stop and the episode ended there, never past the context.
    stopped = [answer for answers in env.replies.values() for answer in answers if "stop" in answer]
    assert stopped and stopped[-1]["stop"] == "context_length"
    assert rollout.completion.truncated
    assert len(rollout.prompt_ids) + len(rollout.completion.token_ids) <= context
    assert all(len(ids) < context for prompts, _, _ in backend.calls for ids in prompts)


def test_a_group_shares_the_common_prefix_of_its_first_prompts_and_masks_the_rest():
    sampled = Completion(token_ids=[50, 51], logprobs=[-1.0, -2.0], truncated=False, loss_mask=[1, 1])
    rollouts = [
        EpisodeRollout(prompt_ids=[1, 2, 3, 4], completion=sampled, text="", reward=0.0, functions={}, turns=1, stop_condition=None),
        EpisodeRollout(prompt_ids=[1, 2, 9], completion=sampled, text="", reward=0.0, functions={}, turns=1, stop_condition=None),
    ]
    prompt, completions = group_rollouts(rollouts)
    assert prompt == [1, 2]
    assert [c.token_ids for c in completions] == [[3, 4, 50, 51], [9, 50, 51]]
    assert [c.loss_mask for c in completions] == [[0, 0, 1, 1], [0, 1, 1]]
    assert [c.logprobs for c in completions] == [[0.0, 0.0, -1.0, -2.0], [0.0, -1.0, -2.0]]


def test_environment_tokens_stay_out_of_the_loss_the_ratio_and_the_kl(tiny):
    model, tokenizer, _ = tiny
    # One group of two multi-turn rollouts: sampled (1) and environment (0) tokens interleaved.
    prompt = [5, 6, 7]
    completions = [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23]]
    masks = [[1, 1, 0, 0, 1, 1], [1, 0, 1, 0]]
    packed = pack_rollouts([prompt], completions, 2, tokenizer.pad_token_id, masks)
    assert packed.completion_mask.tolist() == [[1, 1, 0, 0, 1, 1], [1, 0, 1, 0, 0, 0]]
    logits = completion_logits(model, packed)
    logprobs, _ = token_logprobs_and_entropy(logits, packed.completion_ids, 1.0)
    advantages = torch.tensor([1.0, -1.0])
    sampling = logprobs.detach().clone()
    terms = grpo_loss(logprobs, sampling, advantages, packed.completion_mask)
    # Whatever log-probability an environment token carries (the engine records 0.0, far from
    # the policy's), the loss, the ratio and the KL estimate are those of the sampled tokens.
    garbage = sampling.clone()
    garbage[packed.completion_mask == 0] = 0.0
    other = grpo_loss(logprobs, garbage, advantages, packed.completion_mask)
    assert float(other.loss.detach()) == pytest.approx(float(terms.loss.detach()), abs=1e-7)
    assert (other.ratio_mean, other.mismatch_kl, other.clipped_fraction) == pytest.approx((1.0, 0.0, 0.0), abs=1e-6)
    # The gradient reaches the policy only through the sampled positions.
    grads = torch.autograd.grad(grpo_loss(logprobs, garbage, advantages, packed.completion_mask).loss, logprobs)[0]
    assert torch.all(grads[packed.completion_mask == 0] == 0)
    assert torch.all(grads[packed.completion_mask == 1] != 0)


def test_filters_and_token_counts_see_the_sampled_tokens_only():
    completion = Completion(token_ids=[1, 2, 3, 3, 3, 3, 4], logprobs=[-0.5, -0.5, 0.0, 0.0, 0.0, 0.0, -0.5], truncated=False,
                            loss_mask=[1, 1, 0, 0, 0, 0, 1])
    assert completion.sampled_count == 3
    assert completion.sampled_token_ids() == [1, 2, 4]
    assert completion.sampled_logprobs() == [-0.5, -0.5, -0.5]
    single = Completion(token_ids=[1, 2], logprobs=[-1.0, -1.0], truncated=False)
    assert (single.sampled_count, single.sampled_token_ids(), single.sampled_logprobs()) == (2, [1, 2], [-1.0, -1.0])

    class Repetition:
        type = "repetition"
        enforced = True

        def settings(self):
            return {"ngram_size": 1, "max_repeats": 2}

    # The environment's repeated token (3, four times) does not make the reply repetitive.
    rollouts = Rollouts(rewards=[0.0], token_ids=[completion.sampled_token_ids()], logprobs=[completion.sampled_logprobs()],
                        texts=["x"], group_size=1)
    keep, flagged = apply_filters([Repetition()], rollouts, [True])
    assert keep == [True] and not flagged.get("repetition")


def test_a_batch_file_carries_the_loss_masks():
    batch = RolloutBatch(
        step=1, policy_version=0, env_indices=[0], prompts=[[1, 2]],
        completions=[Completion(token_ids=[3, 4, 5], logprobs=[-1.0, 0.0, -2.0], truncated=False, loss_mask=[1, 0, 1]),
                     Completion(token_ids=[6], logprobs=[-1.0], truncated=True)],
        texts=["a", "b"], rewards=[1.0, 0.0], functions=[{}, {}], generate_seconds=0.1, env_names=["scripted"],
    )
    restored = batch_from_json(batch_to_json(batch))
    assert [c.loss_mask for c in restored.completions] == [[1, 0, 1], None]
    assert [c.timed_out for c in restored.completions] == [False, False]
    batch.completions[1].timed_out = True
    assert [c.timed_out for c in batch_from_json(batch_to_json(batch)).completions] == [False, True]


def test_every_rollout_reports_every_reward_function_even_when_no_episode_was_scored():
    """A function recorded on some episodes only counts 0 on the others; when every episode
    timed out (scored nothing) the environment's own functions still read 0."""
    assert complete_functions([{}, {}], ["correct", "used_tool"]) == [{"correct": 0.0, "used_tool": 0.0}] * 2
    assert complete_functions([{"correct": 1.0, "bonus": 0.5}, {}], ["correct"]) == [
        {"correct": 1.0, "bonus": 0.5}, {"correct": 0.0, "bonus": 0.0}]
