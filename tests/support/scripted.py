"""A rollout backend whose replies are scripted, and the engine's side of a bridge's opened
environment, for driving multi-turn episodes through ``engine.multi_turn.run_episodes`` without a
model."""

from __future__ import annotations

from collections.abc import Callable

from engine.rollout import Completion


class ScriptedBackend:
    """Answers each prompt with ``reply(rendered prompt text)`` and the end-of-sequence token, each
    token's log-probability -0.5; ``prompts`` keeps every rendered prompt in order."""

    policy_version = 0

    def __init__(self, tokenizer, reply: Callable[[str], str]):
        self.tokenizer, self.reply = tokenizer, reply
        self.prompts: list[str] = []

    def generate(self, prompts, **_sampling):
        completions = []
        for ids in prompts:
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            self.prompts.append(text)
            tokens = self.tokenizer.encode(self.reply(text), add_special_tokens=False) + [self.tokenizer.eos_token_id]
            completions.append(Completion(token_ids=tokens, logprobs=[-0.5] * len(tokens), truncated=False))
        return completions


class BridgeEnvironment:
    """The engine's side of one opened multi-turn environment (what
    ``engine.environments.verifiers_taskset.VerifiersTaskset`` asks its bridge), for ``run_episodes``."""

    retries, timeout = 0, None

    def __init__(self, bridge, handle: int, env_id: str, limits: dict | None = None):
        self.bridge, self.handle, self.id = bridge, handle, env_id
        self.limits = dict(limits or {})

    def start_episodes(self, task_ids, limits):
        return self.bridge.request("start", handle=self.handle, task_ids=task_ids, limits=dict(limits), timeout_s=self.timeout)

    def reply(self, answers):
        return self.bridge.request("reply", handle=self.handle, answers=answers)
