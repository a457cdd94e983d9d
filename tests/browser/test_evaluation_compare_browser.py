"""The evaluation pages in headless Chromium (Debian's ``chromium`` driven by Playwright) against
Django's live server: an evaluation of a base model and one of a checkpoint trained from it, their
samples reported through the ingest API as an engine would (no engine runs), are picked in the
project's evaluations list and shown side by side on the comparison page, each example with which
of them solves it; no page breaks the Content-Security-Policy. A screenshot of the comparison is
saved as an artifact (its path is printed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs.models import Checkpoint, CheckpointStatus
from tests.support.browser import signed_in_page
from tests.support.evaluation_pages import ended_evaluation
from tests.support.evaluations import evaluation_body
from tests.support.jobs_helpers import Engine, submit

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]

PROJECT = "/o/acme/p/default/"
ADDITION = {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 4, "rollouts_per_example": 2}


def test_a_base_model_and_its_checkpoint_are_compared_side_by_side(live_server, owner, spec):
    trained = submit(owner, spec, name="adder")
    Engine(trained).running(step=4)
    checkpoint = Checkpoint.objects.create(job=trained, step=4, attempt=1, status=CheckpointStatus.READY,
                                           format="peft-lora", size_bytes=1000, sha256="0" * 64)
    # The base model solves example 0; the checkpoint solves examples 0 to 2.
    base = ended_evaluation(owner, evaluation_body(name="base", environments=[ADDITION]),
                            reward=lambda environment, example, rollout: float(example == 0))
    tuned = ended_evaluation(
        owner, evaluation_body(name="checkpoint", model={"type": "checkpoint", "id": checkpoint.public_id}, environments=[ADDITION]),
        reward=lambda environment, example, rollout: float(example <= 2),
    )
    violations: list[str] = []

    with signed_in_page(live_server, owner.user, violations=violations, viewport={"width": 1440, "height": 1000}) as page:
        page.goto(PROJECT)
        page.click("#project-evaluations")
        page.wait_for_url(f"**{PROJECT}evaluations/")
        listed = page.eval_on_selector_all("tr[data-evaluation]", "rows => rows.map(r => r.dataset.evaluation)")
        page.check(f"#pick-{base.public_id}")
        page.check(f"#pick-{tuned.public_id}")
        page.click("#compare-picked button")
        page.wait_for_selector("#compared-examples .side-by-side")
        columns = page.eval_on_selector_all(
            "#compare-columns tbody tr", "rows => rows.map(r => [r.dataset.evaluation, r.querySelector('.solved-count').textContent])"
        )
        examples = page.eval_on_selector_all(
            ".compared-example",
            """cards => cards.map(card => Array.from(card.querySelectorAll('.side')).map(side => [
                side.dataset.evaluation, side.classList.contains('solved'), side.querySelector('pre').textContent,
                side.getBoundingClientRect().top, side.getBoundingClientRect().left]))""",
        )
        shot = artifacts_dir() / "evaluation-compare.png"
        page.screenshot(path=str(shot), full_page=True)
        page.select_option("#compare-show", "all")
        page.click("#compare-form button[type=submit]")
        page.wait_for_url("**show=all**")
        verdicts = page.eval_on_selector_all(".compared-example", "cards => cards.map(card => card.className)")
        page.click(f".compared-example .side[data-evaluation='{tuned.public_id}'] a")
        page.wait_for_selector("#sample-scores")
        sample_page = page.url

    print(f"\nevaluation comparison screenshot: {shot}")
    assert listed == [tuned.public_id, base.public_id]
    # In the list's order (newest first): the checkpoint, then the base model.
    assert columns == [[tuned.public_id, "3"], [base.public_id, "1"]]
    # Examples 1 and 2: the checkpoint's completion beside the base model's, on one line.
    assert len(examples) == 2
    for sides in examples:
        assert [(evaluation, solved, text) for evaluation, solved, text, _, _ in sides] == [
            (tuned.public_id, True, "reply 0"), (base.public_id, False, "reply 0"),
        ]
        assert sides[0][3] == sides[1][3] and sides[0][4] < sides[1][4]  # one row, side by side
    assert [name.split()[-1] for name in verdicts] == ["verdict-all", "verdict-split", "verdict-split", "verdict-none"]
    assert f"{PROJECT}evaluations/{tuned.public_id}/samples/evs_" in sample_page
    assert violations == []


def artifacts_dir() -> Path:
    root = Path(os.environ.get("LAB_TEST_ARTIFACTS") or Path(os.environ.get("LAB_DATA_DIR", "var")) / "test-artifacts")
    root.mkdir(parents=True, exist_ok=True)
    return root
