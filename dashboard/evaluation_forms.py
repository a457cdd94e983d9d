"""The dashboard's "Evaluate" form: what ``POST /evaluations`` takes, as fields.

The form checks only that each field has its type; ``evaluations.services.evaluation_create``
checks the rest (bounds, environments, arguments, the model's context, the pool) and
``add_problems`` puts each of its problems next to the field it names.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from dashboard.access import refusal_message
from lab.errors import LabError

#: The target types the form sends (``model.type`` of the body).
TARGET_TYPES = ("model", "checkpoint", "adapter")


class EvaluationForm(forms.Form):
    """Evaluate a model, a checkpoint or an adapter (``target_type`` and ``target_id``, carried
    from the page that offered it) on environments picked from those the organization may use."""

    target_type = forms.ChoiceField(choices=[(value, value) for value in TARGET_TYPES], widget=forms.HiddenInput)
    target_id = forms.CharField(max_length=256, widget=forms.HiddenInput)
    name = forms.CharField(max_length=128, required=False)
    environments = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, label="Environments")
    args = forms.CharField(
        required=False, label="Arguments",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "code"}),
        help_text='A JSON object by environment id, e.g. {"lab/addition": {"max_operand": 9}}; an environment left out takes its defaults.',
    )
    num_examples = forms.CharField(
        max_length=8, initial="32", label="Examples per environment", help_text='A number, or "all" for the whole eval split.'
    )
    rollouts_per_example = forms.IntegerField(initial=1, label="Rollouts per example", help_text="pass@k is reported up to this k.")
    temperature = forms.FloatField(initial=1.0)
    top_p = forms.FloatField(initial=1.0, label="Top-p")
    max_tokens = forms.IntegerField(initial=128, label="Max tokens")
    seed = forms.IntegerField(initial=0)
    gpu_type = forms.CharField(max_length=32, initial="cpu", label="GPU type")
    gpus = forms.IntegerField(required=False, label="GPUs")
    # A one-time token issued with the form: the same form posted twice starts one evaluation.
    submission = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    def __init__(self, *args, environment_ids: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["environments"].choices = [(value, value) for value in environment_ids]

    def clean_args(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("args") or "").strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except ValueError as error:
            raise ValidationError(f"Not JSON: {error}.") from None
        if not isinstance(value, dict) or not all(isinstance(item, dict) for item in value.values()):
            raise ValidationError("Give a JSON object whose values are objects: the arguments of each environment by its id.")
        return value

    def clean_num_examples(self) -> int | str:
        value = self.cleaned_data["num_examples"].strip()
        if value == "all":
            return value
        try:
            return int(value)
        except ValueError:
            raise ValidationError('Enter a whole number, or "all".') from None

    def body(self) -> dict[str, Any]:
        """The body of ``POST /evaluations`` (docs/evaluations.md) from the cleaned fields."""
        data = self.cleaned_data
        arguments = data["args"]
        resources: dict[str, Any] = {"gpu_type": data["gpu_type"]}
        if data.get("gpus") is not None:
            resources["gpus"] = data["gpus"]
        body = {
            "model": {"type": data["target_type"], "id": data["target_id"]},
            "environments": [
                {
                    "id": environment,
                    "args": arguments.get(environment, {}),
                    "num_examples": data["num_examples"],
                    "rollouts_per_example": data["rollouts_per_example"],
                }
                for environment in data["environments"]
            ],
            "sampling": {key: data[key] for key in ("temperature", "top_p", "max_tokens", "seed")},
            "resources": resources,
        }
        if data.get("name"):
            body["name"] = data["name"]
        return body

    @staticmethod
    def digest(body: dict[str, Any]) -> str:
        """The SHA-256 of ``body`` as canonical JSON: what a submission token is bound to."""
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def add_problems(self, error: LabError) -> None:
        """Put the service's problems next to the fields they name (``environments.0.args.x`` under
        the arguments, ``sampling.top_p`` under top-p, ``resources.gpus`` under GPUs, ...); the
        others, and a refusal without fields, above the form. A ``permission_denied`` refusal
        raises PermissionDenied (the 403 page)."""
        message = refusal_message(error)
        for problem in error.errors or []:
            field = _field_of(problem.param or "")
            shown = f"{problem.param}: {problem.message}" if problem.param else problem.message
            self.add_error(field if field in self.fields else None, shown)
        if not error.errors:
            self.add_error(None, message)


def _field_of(param: str) -> str | None:
    """The form field a body param is entered in."""
    parts = param.split(".")
    if parts[0] == "environments" and len(parts) >= 3:
        return {"args": "args", "num_examples": "num_examples", "rollouts_per_example": "rollouts_per_example"}.get(
            parts[2], "environments"
        )
    if parts[0] == "environments":
        return "environments"
    if parts[0] in ("sampling", "resources") and len(parts) == 2:
        return parts[1]
    if parts[0] == "name":
        return "name"
    return None
