"""The orchestrator role's side of the shared directory (engine/roles.py `OrchestratorRole`), run
in a thread against files a test writes as the trainer would: which session it follows, which
policy samples each batch, and that it ends when the trainer has ended, however that was."""

from __future__ import annotations

import json
import threading
import time

from engine.orchestrator import RolloutBatch
from engine.roles import OrchestratorRole, batch_from_json, batch_path, sampling_version, weights_path, write_json
from engine.rollout import Completion


class Backend:
    def __init__(self):
        self.loaded = []

    def load_weights_dir(self, directory, policy_version, restart=False):
        self.loaded.append((policy_version, restart))


class Rollouts:
    """Stands in for engine.orchestrator.Orchestrator: one completion per batch, no evals."""

    def __init__(self):
        self.backend = Backend()

    def held_out_due(self, version):
        return False

    def batch(self, step, policy_version):
        completion = Completion(token_ids=[1, 2], logprobs=[-0.5, -0.25], truncated=False, policy_version=policy_version)
        return RolloutBatch(step=step, policy_version=policy_version, env_indices=[0], prompts=[[7]], completions=[completion],
                            texts=["ab"], rewards=[1.0], functions=[{"exact": 1.0}], generate_seconds=0.01, env_names=["e"])


def session(root, name, *, start_step=1, max_steps=3, depth=1, ended=False):
    (root / name / "weights").mkdir(parents=True, exist_ok=True)
    (root / name / "batches").mkdir(exist_ok=True)
    write_json(root / "session.json", {"session": name, "job_id": "job_1", "attempt": 1, "start_step": start_step,
                                       "next_batch_step": start_step, "max_steps": max_steps, "async_depth": depth})
    if ended:
        write_json(root / name / "exit.json", {"exit_code": 0})
    return root / name


def publish(directory, version):
    weights_path(directory, version).mkdir(parents=True)


def serve(root):
    rollouts = Rollouts()
    role = OrchestratorRole(root, rollouts)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", role.run()), daemon=True)
    thread.start()
    return thread, result, rollouts


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_each_batch_is_sampled_by_the_policy_its_step_allows_and_the_role_ends_with_the_trainer(tmp_path):
    directory = session(tmp_path, "s1", max_steps=3, depth=1)
    publish(directory, 0)
    thread, result, rollouts = serve(tmp_path)
    wait_until(lambda: batch_path(directory, 2).exists())
    assert not batch_path(directory, 3).exists()  # step 3 needs policy 1, not yet published
    publish(directory, 1)
    wait_until(lambda: batch_path(directory, 3).exists())
    batches = [batch_from_json(json.loads(batch_path(directory, s).read_text())) for s in (1, 2, 3)]
    assert [b.policy_version for b in batches] == [sampling_version(s, start_step=1, depth=1) for s in (1, 2, 3)] == [0, 0, 1]
    assert rollouts.backend.loaded == [(0, True), (1, False)]  # a session's first load may go below the loaded version
    assert (directory / "alive").exists()  # its heartbeat
    write_json(directory / "final.json", {"last_step": 3})
    wait_until(lambda: (directory / "done.json").exists())
    assert thread.is_alive()  # it waits for the trainer to report the end
    write_json(directory / "exit.json", {"exit_code": 0})
    thread.join(timeout=10)
    assert result == {"code": 0}


def test_a_trainer_that_ended_without_its_last_update_ends_the_role(tmp_path):
    directory = session(tmp_path, "s1", max_steps=5, depth=0)
    publish(directory, 0)
    thread, result, _ = serve(tmp_path)
    wait_until(lambda: batch_path(directory, 1).exists())  # step 2 waits for policy 1, which never comes
    write_json(directory / "exit.json", {"exit_code": 1})
    thread.join(timeout=10)
    assert not thread.is_alive() and result == {"code": 0}


def test_an_ended_session_is_ignored_and_a_new_session_replaces_the_one_being_served(tmp_path):
    session(tmp_path, "old", ended=True)
    thread, result, rollouts = serve(tmp_path)
    time.sleep(0.5)
    assert rollouts.backend.loaded == []  # the ended session was not followed
    first = session(tmp_path, "s1", max_steps=3, depth=0)
    publish(first, 0)
    wait_until(lambda: batch_path(first, 1).exists())
    second = session(tmp_path, "s2", start_step=2, max_steps=3, depth=0)  # a new trainer, resumed after step 1
    publish(second, 1)
    wait_until(lambda: batch_path(second, 2).exists())
    assert batch_from_json(json.loads(batch_path(second, 2).read_text())).policy_version == 1
    write_json(second / "exit.json", {"exit_code": 0})
    thread.join(timeout=10)
    assert result == {"code": 0}


def test_a_silent_orchestrator_is_told_from_a_slow_one(tmp_path):
    import os

    from engine.roles import SILENCE_S, START_SILENCE_S, silence_s

    alive = tmp_path / "alive"
    started = time.monotonic()
    assert silence_s(alive, since=started) is None  # not started yet, within its start-up time
    assert silence_s(alive, since=started, now=started + START_SILENCE_S + 1) > START_SILENCE_S
    alive.touch()
    assert silence_s(alive, since=started - 10_000) is None  # heard from just now
    os.utime(alive, (time.time() - SILENCE_S - 5, time.time() - SILENCE_S - 5))
    assert silence_s(alive, since=started) >= SILENCE_S


def test_malformed_files_in_the_shared_directory_are_named(tmp_path):
    import pytest

    from engine.roles import RoleFailed, read_json

    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / "failed.json").write_text("not json{")
    with pytest.raises(RoleFailed, match="s1/failed.json is not readable JSON"):
        read_json(tmp_path / "s1" / "failed.json")
    (tmp_path / "s1" / "done.json").write_text("[1, 2]")
    with pytest.raises(RoleFailed, match="s1/done.json is not a JSON object"):
        read_json(tmp_path / "s1" / "done.json")
