"""The engine's check of a model directory before Lab offers it (engine.model_check): what it
reports for each architecture it trains, and each refusal naming what is wrong."""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from engine.catalog import (
    TINY_RANDOM_LLAMA_ID,
    TINY_RANDOM_MODEL_IDS,
    TINY_RANDOM_QWEN2_ID,
    TINY_RANDOM_QWEN3_ID,
    TINY_RANDOM_QWEN3_MOE_ID,
    list_models,
)
from engine.model_check import ModelRefused, check_directory, extract_archive, main, safetensors_header
from tests.support.model_dirs import tar_directory, tiny_model_directory
from tests.support.stack import wait_for

REPOSITORY = Path(__file__).resolve().parents[2]

#: Parameters of the tiny models, counted by hand from their configs (tied embeddings counted
#: once): embeddings 100 × 64 = 6,400; per layer (2) attention q 64×64, k and v 64×32, o 64×64 =
#: 12,288, MLP gate, up and down 64×128 = 24,576, two norms of 64; the final norm 64.
TINY_PARAMETERS = {
    TINY_RANDOM_LLAMA_ID: 80_448,
    TINY_RANDOM_QWEN2_ID: 80_704,  # + the q, k and v biases (64 + 32 + 32 per layer)
    TINY_RANDOM_QWEN3_ID: 80_576,  # + the q and k RMS norms (32 + 32 per layer)
}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return tiny_model_directory(tmp_path_factory.mktemp("qwen3") / "model")


@pytest.mark.parametrize("model_id", [TINY_RANDOM_LLAMA_ID, TINY_RANDOM_QWEN2_ID, TINY_RANDOM_QWEN3_ID])
def test_it_reports_a_dense_model_of_each_architecture(tmp_path, model_id):
    report = check_directory(tiny_model_directory(tmp_path / "model", model_id))
    assert report == {
        "architecture": model_id.removeprefix("lab/tiny-random-").replace("-", "_"),
        "parameters": TINY_PARAMETERS[model_id],
        "active_parameters": None,
        "context_length": 512,
        "chat_template": True,
        "tool_call_format": "",
        "licence": "",
        "files": ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                  "tokenizer.json", "tokenizer_config.json"],
        "left_out": [],
    }


def test_it_counts_the_active_parameters_of_a_mixture_of_experts(tmp_path):
    directory = tiny_model_directory(tmp_path / "model", TINY_RANDOM_QWEN3_MOE_ID)
    report = check_directory(directory)
    # Qwen3's attention and norms, and per layer a router of 64 × 4 and 4 experts of 3 × 64 × 32
    # weights: 49,152 expert weights in all, 2 of the 4 experts used per token.
    assert (report["architecture"], report["parameters"], report["active_parameters"]) == ("qwen3_moe", 81_088, 81_088 - 24_576)


@pytest.mark.parametrize("model_id", sorted(TINY_RANDOM_MODEL_IDS))
def test_the_catalogue_gives_each_test_model_the_parameters_the_check_counts(tmp_path, model_id):
    """`lab models` shows the catalogue's counts: they are the ones the check counts in the model built."""
    report = check_directory(tiny_model_directory(tmp_path / "model", model_id))
    info = list_models(tmp_path / "models")[model_id]
    assert (info.parameters, info.active_parameters) == (report["parameters"], report["active_parameters"])


def test_it_reads_the_licence_and_the_tool_call_format_and_leaves_other_files_out(qwen3, tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    for path in qwen3.iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    (directory / "README.md").write_text("---\nlicense: apache-2.0\ntags: [x]\n---\n# A model\n")
    (directory / "modeling_custom.py").write_text("raise SystemExit('never run')\n")
    template = (directory / "chat_template.jinja").read_text()
    (directory / "chat_template.jinja").write_text(template + "{# <tool_call> #}")
    report = check_directory(directory)
    assert (report["licence"], report["tool_call_format"]) == ("apache-2.0", "hermes")
    assert report["left_out"] == ["modeling_custom.py"]
    assert "README.md" in report["files"] and "modeling_custom.py" not in report["files"]


def _copy(source, target):
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def test_it_refuses_pickles(qwen3, tmp_path):
    directory = _copy(qwen3, tmp_path / "model")
    (directory / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(ModelRefused, match="pickle files, which run code when loaded: pytorch_model.bin"):
        check_directory(directory)


def test_it_refuses_an_architecture_the_engine_does_not_train(qwen3, tmp_path):
    directory = _copy(qwen3, tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"model_type": "gpt_oss"}))
    with pytest.raises(ModelRefused, match=r"model_type 'gpt_oss' is not an architecture the engine trains \(supported: llama, qwen2, qwen3, qwen3_moe\)"):
        check_directory(directory)


def test_it_refuses_a_directory_without_safetensors_weights(qwen3, tmp_path):
    directory = _copy(qwen3, tmp_path / "model")
    (directory / "model.safetensors").unlink()
    with pytest.raises(ModelRefused, match="no safetensors weights"):
        check_directory(directory)


def test_it_refuses_weights_that_do_not_match_the_config(qwen3, tmp_path):
    directory = _copy(qwen3, tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"intermediate_size": 256}))  # MLPs twice as wide
    with pytest.raises(ModelRefused, match="the safetensors hold 80,576 parameters, but a qwen3 of this config.json has 129,728"):
        check_directory(directory)


def test_it_refuses_a_truncated_safetensors_file(qwen3, tmp_path):
    directory = _copy(qwen3, tmp_path / "model")
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ModelRefused, match="lies outside the file or has the wrong size"):
        check_directory(directory)


def test_it_refuses_a_header_that_claims_more_than_the_file(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(ModelRefused, match="its header claims 1000000000 bytes"):
        safetensors_header(path)


def test_it_refuses_a_missing_shard(qwen3, tmp_path):
    directory = _copy(qwen3, tmp_path / "model")
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    ))
    with pytest.raises(ModelRefused, match="names shards that are missing: model-00001-of-00002.safetensors"):
        check_directory(directory)


def test_it_refuses_a_tokenizer_that_does_not_load(qwen3, tmp_path):
    directory = _copy(qwen3, tmp_path / "model")
    (directory / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelRefused, match="the tokenizer does not load"):
        check_directory(directory)


def test_an_archive_unpacks_to_its_one_folder(qwen3, tmp_path):
    archive = tar_directory(qwen3, tmp_path / "model.tar.gz", top="my-model", gzip=True)
    directory = extract_archive(archive, tmp_path / "out", max_bytes=10**9)
    assert directory == tmp_path / "out" / "my-model"
    assert (directory / "config.json").read_bytes() == (qwen3 / "config.json").read_bytes()


def _tar(tmp_path, members) -> object:
    path = tmp_path / "hostile.tar"
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([_file("../escape.txt")], "leaves its directory"),
        ([_file("/etc/evil")], "leaves its directory"),
        ([_link("config.json", "/etc/passwd")], "not a regular file"),
        ([_link("config.json", "tokenizer.json", tarfile.LNKTYPE)], "not a regular file"),
        ([_file("big.safetensors", b"y" * 2000)], "unpacks to more than 1000 bytes"),
    ],
)
def test_an_archive_that_would_escape_or_overflow_is_refused(tmp_path, members, message):
    with pytest.raises(ModelRefused, match=message):
        extract_archive(_tar(tmp_path, members), tmp_path / "out", max_bytes=1000)
    assert not (tmp_path / "escape.txt").exists()


def test_the_command_writes_a_refusal_and_exits_0(tmp_path):
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all")
    assert main(["--directory", str(tmp_path / "out"), "--result", str(tmp_path / "result.json"),
                 "--archive", str(tmp_path / "junk.tar")]) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "failed" and result["error"].startswith("the upload is not a readable tar archive")


def test_a_check_outside_bubblewrap_ends_with_the_worker_that_started_it(tmp_path):
    """With ``LAB_LOCAL_ISOLATION=none`` a worker killed with SIGKILL mid-check takes its check with
    it, as bubblewrap's ``--die-with-parent`` does for a sandboxed one (jobs.registry.checks)."""
    archive, scratch = tmp_path / "blocking-model.tar", tmp_path / "scratch"
    os.mkfifo(archive)  # nothing ever writes it: the check waits on it until it is ended
    scratch.mkdir()
    worker = subprocess.Popen(
        [sys.executable, "-c",
         "import django; django.setup(); from pathlib import Path; from jobs.registry.checks import run_check; "
         f"run_check(scratch=Path({str(scratch)!r}), directory=Path({str(scratch / 'model')!r}), "
         f"archive=Path({str(archive)!r}), sandbox=False, timeout_s=600)"],
        cwd=REPOSITORY, env={**os.environ, "DJANGO_SETTINGS_MODULE": "lab.settings"}, start_new_session=True,
    )

    def checks() -> list[str]:
        found = subprocess.run(["pgrep", "-f", f"engine.model_check.*{archive}"], capture_output=True, text=True)
        return found.stdout.split()

    try:
        wait_for(checks, timeout=60, what="the check to start")
        worker.kill()
        worker.wait()
        wait_for(lambda: not checks(), timeout=30, what="the check to end with its worker")
    finally:
        for pid in checks():
            os.kill(int(pid), signal.SIGKILL)
        if worker.poll() is None:
            worker.kill()
