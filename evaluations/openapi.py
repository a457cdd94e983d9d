"""OpenAPI components of the evaluation bodies (docs/evaluations.md), as ``evaluations/serializers.py``
builds them; the create body is ``evaluations.specs.EvaluationCreate``'s own JSON Schema."""

from __future__ import annotations

from evaluations.models import Source, TargetType
from evaluations.pushes import PushCreate, PushedSamples
from evaluations.specs import EvaluationCreate
from jobs.models import JobStatus
from lab.api.schema import (
    BOOLEAN,
    FREE_OBJECT,
    INTEGER,
    MONEY,
    NUMBER,
    STRING,
    TIMESTAMP,
    component,
    json_schema_component,
    list_component,
    nullable,
    obj,
)

_NUMBERS = {"type": "object", "additionalProperties": NUMBER}

EVALUATION_CREATE = json_schema_component("EvaluationCreate", EvaluationCreate.model_json_schema())
EVALUATION_PUSH = json_schema_component("EvaluationPush", PushCreate.model_json_schema())
EVALUATION_SAMPLES_PUSH = json_schema_component("EvaluationSamplesPush", PushedSamples.model_json_schema())
EVALUATION_SAMPLES_PUSHED = component(
    "EvaluationSamplesPushed",
    obj({"accepted": INTEGER, "duplicates": INTEGER}, description="Samples stored, and those stored already (kept once)."),
)

ENVIRONMENT_RESULTS = component(
    "EvaluationEnvironmentResults",
    obj(
        {
            "samples": INTEGER,
            "examples": INTEGER,
            "reward_mean": nullable(NUMBER),
            "reward_stderr": nullable(NUMBER) | {"description": "standard error of the mean over examples"},
            "functions": _NUMBERS | {"description": "reward function name: its mean score"},
            "pass_at_k": _NUMBERS | {"description": "k: unbiased pass@k (a success is a reward of at least 1)"},
            "errors": INTEGER,
            "timeouts": INTEGER,
            "truncated": INTEGER,
            "tokens": obj({"prompt": INTEGER, "completion": INTEGER}),
        },
        description="What an environment's samples came to.",
    ),
)

EVALUATION = component(
    "Evaluation",
    obj(
        {
            "id": STRING,
            "object": {"const": "evaluation"},
            "name": STRING,
            "source": {"type": "string", "enum": list(Source.values)}
            | {"description": "lab: run by Lab; pushed: run elsewhere, its samples pushed"},
            "status": {"type": "string", "enum": list(JobStatus.values)},
            "status_reason": nullable(STRING),
            "job_id": STRING,
            "model": obj({"type": {"type": "string", "enum": list(TargetType.values)}, "id": STRING}),
            "base_model": STRING,
            "environments": {
                "type": "array",
                "items": obj(
                    {
                        "id": STRING,
                        "args": FREE_OBJECT,
                        "num_examples": {"anyOf": [INTEGER, {"const": "all"}]},
                        "rollouts_per_example": INTEGER,
                    }
                ),
            },
            "sampling": obj(
                {"temperature": nullable(NUMBER), "top_p": nullable(NUMBER), "max_tokens": nullable(INTEGER), "seed": nullable(INTEGER)},
                description="null only where a pushed run did not record it",
            ),
            "progress": obj({"samples": INTEGER, "expected_samples": nullable(INTEGER)}),
            "results": nullable({"type": "object", "additionalProperties": ENVIRONMENT_RESULTS}),
            "error": nullable(obj({"code": STRING, "message": STRING})),
            "usage": obj(
                {
                    "gpu_seconds": NUMBER,
                    "cpu_seconds": NUMBER,
                    "cost_usd": MONEY,
                    "prompt_tokens": INTEGER,
                    "completion_tokens": INTEGER,
                }
            ),
            "metadata": {"type": "object", "additionalProperties": STRING},
            "details": FREE_OBJECT | {"description": "what a pushed run's own files said of it; {} for Lab's own"},
            "created_at": TIMESTAMP,
            "started_at": nullable(TIMESTAMP),
            "finished_at": nullable(TIMESTAMP),
        },
        description="A model or checkpoint scored on environments (eval_...); results by environment id once it has ended.",
    ),
)
EVALUATION_LIST = list_component("Evaluation", "The project's evaluations, newest first.")

EVALUATION_SAMPLE = component(
    "EvaluationSample",
    obj(
        {
            "id": STRING,
            "object": {"const": "evaluation_sample"},
            "environment": nullable(STRING),
            "example": INTEGER,
            "rollout": INTEGER,
            "prompt": {"type": "array", "items": FREE_OBJECT, "description": "the example's chat messages"},
            "completion": STRING,
            "answer": STRING,
            "reward": NUMBER,
            "functions": _NUMBERS,
            "info": FREE_OBJECT,
            "tokens": obj({"prompt": INTEGER, "completion": INTEGER}),
            "latency_s": NUMBER,
            "truncated": BOOLEAN,
            "timed_out": BOOLEAN,
            "error": nullable(STRING),
            "attempt": INTEGER,
            "created_at": TIMESTAMP,
        },
        description="One scored rollout of an evaluation.",
    ),
)
EVALUATION_SAMPLE_LIST = list_component("EvaluationSample", "An evaluation's samples, in the order they were stored.")
