"""The engine's log line of a training step, as ``lab jobs logs`` shows it:

``step 3/20 reward 0.412 loss 0.0131 entropy 1.204 time 2.1s (generate 1.6s, train 0.5s)``, with
``, waited Xs`` after the generate time when the batch came from an older policy than the last
step's, and a note when the zero-advantage filter dropped the whole batch (the step learned
nothing, which its reward and loss alone do not say).
"""

from __future__ import annotations

NO_SIGNAL_NOTE = "; every group had the same reward: nothing to learn from (filter/zero_advantage/fraction 1)"


def seconds_text(seconds: float) -> str:
    """Return a duration for the step log: 2 decimals under 0.1 s (a tiny model's steps), else 1."""
    return f"{seconds:.2f}s" if seconds < 0.1 else f"{seconds:.1f}s"


def no_signal_note(metrics: dict[str, float]) -> str:
    """Return :data:`NO_SIGNAL_NOTE` when a step's metrics say every rollout was dropped for
    zero advantage, else an empty string."""
    return NO_SIGNAL_NOTE if metrics.get("filter/zero_advantage/fraction", 0.0) >= 1.0 else ""


def step_line(step: int, max_steps: int, metrics: dict[str, float], *, step_seconds: float, generate_seconds: float,
              train_seconds: float, waited_seconds: float | None) -> str:
    """Return step ``step``'s log line from its ``metrics`` (``reward/mean``, ``loss/mean``, and
    ``entropy/mean`` when measured) and its times in seconds (``waited_seconds`` None when the
    batch was of the latest policy)."""
    entropy = f"{metrics['entropy/mean']:.3f}" if "entropy/mean" in metrics else "-"
    waited = f", waited {seconds_text(waited_seconds)}" if waited_seconds is not None else ""
    return (
        f"step {step}/{max_steps} reward {metrics['reward/mean']:.3f} loss {metrics['loss/mean']:.4f} entropy {entropy} "
        f"time {seconds_text(step_seconds)} (generate {seconds_text(generate_seconds)}{waited}, train {seconds_text(train_seconds)})"
        f"{no_signal_note(metrics)}"
    )
