"""The job spec: one pydantic model shared by the server, the SDK/CLI and the RL engine.

A job spec says which base model to train, on which environments, with which GRPO
settings. It travels as JSON over the API and as TOML in files (docs/spec.md).
The format is a superset of Prime Intellect's hosted-training TOML
(https://docs.primeintellect.ai/hosted-training/advanced-configs): Prime's keys that Lab
does not use are accepted, kept in the canonical dict and reported as warnings; any other
unknown key is refused with the list of allowed keys.

Validation reports every problem at once as :class:`SpecProblem` rows with a dotted
``param`` path (list indexes as numbers, e.g. ``env.0.id``) and one ``code`` of this
vocabulary:

==========================  ==========================================================
code                        meaning
==========================  ==========================================================
``required``                a required key is missing
``invalid_type``            wrong JSON type (string for a number, float for an integer)
``invalid_value``           right type, refused value (NaN/inf, bad pattern, bad choice,
                            NUL or an unpaired surrogate in text)
``out_of_range``            a number outside its bounds
``too_long``                a string, list or mapping over its size limit
``too_short``               an empty string or list where one item is needed
``too_deep``                JSON-like data nested deeper than allowed
``unknown_key``             a key the spec does not define
``not_divisible``           ``batch_size`` is not a multiple of a group size (``rollouts_per_example``
                            or an ``[[env]] group_size``), or the group sizes cannot fill a batch
``unknown_model``           the model id is not in the model catalogue
``unknown_environment``     an environment id is not installed
``invalid_encoding``        a spec file that is not UTF-8
``invalid_syntax``          a spec file that is not valid TOML or JSON
``duplicate_key``           a key given twice in a spec file
``too_large``               a spec file over 1 MiB (the API's body limit)
``conflicting_keys``        two keys that exclude each other were both given
``missing_secret``          a key names a job secret the job was not given
==========================  ==========================================================

Only ``model`` and ``env`` are required. Defaults: ``max_steps`` 20, ``batch_size`` 32,
``rollouts_per_example`` 4, ``learning_rate`` 1e-4 and ``lora_alpha`` 16 (Prime's documented
defaults), ``lora_rank`` 16 (0 = full fine-tune), ``seed`` 0, ``max_restarts`` 2,
``max_off_policy_steps`` 1, ``priority`` normal, ``max_runtime_minutes`` 600,
``sampling.max_tokens`` 128, ``sampling.temperature`` 1.0, ``eval.interval`` 0 (no eval),
``eval.num_examples`` 32, ``checkpoints.interval`` 10 (0 = only the last step),
``checkpoints.keep_last`` 3, ``resources.gpu_type`` cpu, ``resources.gpus`` 0 on cpu and 1
on a GPU type. Every number has bounds; see each field.

Nothing here imports Django or torch; the catalogues are passed in by the caller.

The package's modules, by role: :mod:`~labsdk.spec.problems` (SpecProblem, SpecError, the
codes), :mod:`~labsdk.spec.values` (storable text, bounded JSON), :mod:`~labsdk.spec.model`
(the pydantic model and its JSON Schema), :mod:`~labsdk.spec.translate` (pydantic errors as
problems), :mod:`~labsdk.spec.layouts` (prime-rl's native layout and the older prime CLI
form, translated), :mod:`~labsdk.spec.warnings` (what Lab does not use, said once),
:mod:`~labsdk.spec.parse` (validation and warnings), :mod:`~labsdk.spec.files`
(TOML/JSON text and files), :mod:`~labsdk.spec.catalog` (catalogue checks) and
:mod:`~labsdk.spec.arguments` (an uploaded package's arguments against its build). Import from
``labsdk.spec`` itself; the module split is not part of the API.
"""

from __future__ import annotations

from labsdk.spec.arguments import argument_problems, type_problem
from labsdk.spec.catalog import EnvironmentInfoLike, ModelInfoLike, catalog_problems
from labsdk.spec.files import MAX_SPEC_BYTES, decode_spec, load_spec_file, loads_spec, read_spec_file
from labsdk.spec.layouts import detect_layout, fit_seq_len, translate_layout
from labsdk.spec.model import (
    JUDGE_ARGS,
    PRIME_UNUSED_KEYS,
    AdaptersConfig,
    BatchFilterConfig,
    CheckpointsConfig,
    EnvConfig,
    EnvJudgeConfig,
    EvalConfig,
    EvalEnvConfig,
    JobSpec,
    ResourcesConfig,
    SamplingConfig,
    TeacherConfig,
    TemperatureScheduleConfig,
    ValConfig,
    job_spec_json_schema,
)
from labsdk.spec.parse import ParsedSpec, parse_spec
from labsdk.spec.problems import SpecError, SpecProblem
from labsdk.spec.secrets import secret_names_used, secret_problems
from labsdk.spec.values import (
    JSON_MAX_DEPTH,
    JSON_MAX_INT,
    JSON_MAX_ITEMS,
    JSON_MAX_KEY,
    JSON_MAX_STRING,
    JsonLike,
    JsonObject,
    MetadataKey,
    MetadataValue,
    Text,
)

__all__ = [
    "JUDGE_ARGS",
    "PRIME_UNUSED_KEYS",
    "AdaptersConfig",
    "BatchFilterConfig",
    "CheckpointsConfig",
    "EnvConfig",
    "EnvJudgeConfig",
    "EvalConfig",
    "EvalEnvConfig",
    "JobSpec",
    "ParsedSpec",
    "ResourcesConfig",
    "SamplingConfig",
    "SpecError",
    "SpecProblem",
    "TeacherConfig",
    "TemperatureScheduleConfig",
    "ValConfig",
    "argument_problems",
    "catalog_problems",
    "decode_spec",
    "detect_layout",
    "fit_seq_len",
    "translate_layout",
    "type_problem",
    "job_spec_json_schema",
    "load_spec_file",
    "loads_spec",
    "parse_spec",
    "read_spec_file",
    "secret_names_used",
    "secret_problems",
]
