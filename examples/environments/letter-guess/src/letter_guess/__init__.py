"""letter-guess: a multi-turn verifiers v1 environment.

The model guesses a secret capital letter. After each guess the environment answers "Earlier in
the alphabet.", "Later in the alphabet." or, for a reply without a single letter, asks for one;
the episode ends when the letter is guessed or the agent's turns run out (`[[env]] max_turns` in
Lab). Rewards, recorded by `LetterGuessEnv.run` on the player's trace:

- `solved` (weight 1): 1 when the last guess is the secret letter;
- `closeness` (weight 0.5): 1 - |last guess - secret| / 25, 0 without any guess;
- `one_letter` (weight 0.25, a `@vf.reward` of the task): the share of replies that are one letter.

Tasks are drawn from a seeded generator (`seed`, `num_tasks`), so nothing is downloaded.
"""

import random
import re
import string

import verifiers.v1 as vf

LETTERS = string.ascii_uppercase


def guessed_letter(reply: str) -> str | None:
    """The letter a reply guesses: its only standalone letter (any case), else None."""
    found = re.findall(r"\b[A-Za-z]\b", reply)
    return found[0].upper() if len(found) == 1 else None


class LetterGuessConfig(vf.TasksetConfig):
    num_tasks: int = 200
    seed: int = 0
    #: The secret is one of the first `letters` letters of the alphabet (2 to 26).
    letters: int = 26


class LetterGuessData(vf.TaskData):
    secret: str
    letters: int


class LetterGuessTask(vf.Task[LetterGuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.25)
    async def one_letter(self, trace: vf.Trace) -> float:
        replies = [message.content or "" for message in trace.assistant_messages]
        return sum(guessed_letter(reply) is not None for reply in replies) / len(replies) if replies else 0.0


class LetterGuessTaskset(vf.Taskset[LetterGuessTask, LetterGuessConfig]):
    """Guess a secret letter; told after each guess whether it comes earlier or later."""

    def load(self):
        letters = max(2, min(26, self.config.letters))
        rng = random.Random(self.config.seed)
        for _ in range(self.config.num_tasks):
            yield LetterGuessTask(
                LetterGuessData(
                    prompt=f"I am thinking of a capital letter from A to {LETTERS[letters - 1]}. Guess it.",
                    system_prompt="Reply with one letter.",
                    secret=rng.choice(LETTERS[:letters]),
                    letters=letters,
                ),
                self.config.task,
            )


class LetterGuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class LetterGuessEnv(vf.Env[LetterGuessEnvConfig]):
    """Answers each guess until the letter is found or the player's turns run out."""

    async def run(self, task, agents):
        secret, last = task.data.secret, None
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                guess = guessed_letter(segment.last_reply)
                last = guess or last
                if guess == secret:
                    break
                if guess is None:
                    feedback = "Reply with a single letter."
                else:
                    feedback = "Earlier in the alphabet." if secret < guess else "Later in the alphabet."
                segment = await interaction.turn(feedback + " Guess again.")
        trace = interaction.trace
        trace.record_reward("solved", 1.0 if last == secret else 0.0, 1.0)
        distance = abs(LETTERS.index(last) - LETTERS.index(secret)) if last else 25
        trace.record_reward("closeness", max(0.0, 1.0 - distance / 25), 0.5)


__all__ = ["LetterGuessTaskset", "LetterGuessEnv"]
