"""Checking answers against the served OpenAPI document's components.

An object component is closed for the check (a property the serializer adds but the component
does not list fails), although the served document leaves objects open so that a new field
never breaks a client.
"""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator
from rest_framework.test import APIClient


def served_document() -> dict:
    """Return the OpenAPI document served at ``/api/v1/schema``, as JSON."""
    response = APIClient().get("/api/v1/schema", {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


def _closed(schema):
    """Return ``schema`` with every object that lists properties closed to others."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed(value) for key, value in schema.items()}
    if "properties" in closed and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed


def assert_matches(document: dict, component: str, body) -> None:
    """Assert that ``body`` is valid for ``components.schemas[component]`` of ``document``, closed
    (module docstring), with formats (``date-time``) checked."""
    root = {"$ref": f"#/components/schemas/{component}", "components": _closed(document["components"])}
    validator = Draft202012Validator(root, format_checker=Draft202012Validator.FORMAT_CHECKER)
    problems = [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(body)]
    assert problems == [], body
