"""The OpenAPI document at ``/api/v1/schema``: operation ids, body components and what every
operation shares.

Bodies are built as plain dicts by the serializers (``jobs/serializers.py``), so they are
described by raw JSON Schema components (OpenAPI 3.1 speaks JSON Schema 2020-12), registered
with ``component`` by the module that owns the shape and referenced from ``@extend_schema``.
``postprocess_lab_schema`` (a drf-spectacular postprocessing hook) then adds, for every
operation, what follows from the conventions of docs/api.md rather than from one view:

* the components themselves;
* the error responses (the one error body, ``Error``) an operation can answer;
* the ``Idempotency-Key`` header of every authenticated POST;
* ``allowEmptyValue`` on every query parameter (an empty value counts as absent), and no NUL
  character in a path or query string (``lab.middleware`` refuses it: no database stores it);
* links from each create answer (``POST /things``, 201) to the operations on
  ``/things/{id}...``, with the id from ``$response.body#/id``, so that clients and stateful
  fuzzers can follow them.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter

from lab.lib.error_types import ERROR_TYPES

Schema = dict[str, Any]

_PREFIX = "#/components/schemas/"
_COMPONENTS: dict[str, Schema] = {}


class LabAutoSchema(AutoSchema):
    """drf-spectacular's schema with ``*_list`` operation ids for GETs on collection paths.

    Plain APIViews are all named ``*_retrieve``, so ``GET /jobs`` and ``GET /jobs/{id}`` would
    collide; a GET whose path does not end in a parameter lists a collection.
    """

    def get_operation_id(self) -> str:
        operation_id = super().get_operation_id()
        if self.method == "GET" and not self.path.rstrip("/").endswith("}") and operation_id.endswith("_retrieve"):
            return operation_id.removesuffix("_retrieve") + "_list"
        return operation_id


# --- components ---------------------------------------------------------------------------------


def ref(name: str) -> Schema:
    """Return a ``$ref`` to the component ``name``."""
    return {"$ref": _PREFIX + name}


def component(name: str, schema: Schema) -> Schema:
    """Register ``schema`` as ``components.schemas[name]`` and return a ``$ref`` to it.

    Raises ValueError when another schema already holds the name.
    """
    if _COMPONENTS.get(name, schema) != schema:
        raise ValueError(f"two OpenAPI components are named {name}")
    _COMPONENTS[name] = schema
    return ref(name)


def json_schema_component(name: str, document: Schema) -> Schema:
    """Register a standalone JSON Schema ``document`` (with ``$defs``, such as the job spec's) as
    the component ``name``; each of its ``$defs`` becomes a component of its own and references
    to them point there. Returns a ``$ref`` to ``name``."""
    document = copy.deepcopy(document)
    document.pop("$schema", None)
    document.pop("title", None)  # the component's name names it (generated clients name classes by title)
    definitions = document.pop("$defs", {})
    text = json.dumps(document | {"$defs": definitions}).replace('"#/$defs/', f'"{_PREFIX}')
    document = json.loads(text)
    for definition, schema in document.pop("$defs").items():
        component(definition, schema)
    return component(name, document)


def list_component(item: str, description: str) -> Schema:
    """Register ``<item>List``, the list envelope ``{"object": "list", "data": [...], "has_more"}``
    of ``item`` components, and return a ``$ref`` to it."""
    return component(
        f"{item}List",
        obj(
            {"object": {"const": "list"}, "data": {"type": "array", "items": ref(item)}, "has_more": BOOLEAN},
            description=description,
        ),
    )


def obj(properties: dict[str, Schema], *, description: str = "", optional: tuple[str, ...] = ()) -> Schema:
    """Return an object schema with ``properties``, all of them required except ``optional``."""
    schema: Schema = {"type": "object", "properties": properties}
    schema["required"] = [name for name in properties if name not in optional]
    if description:
        schema["description"] = description
    return schema


def nullable(schema: Schema) -> Schema:
    """Return ``schema`` or ``null``."""
    if isinstance(schema.get("type"), str) and not {"$ref", "enum", "const"} & schema.keys():
        return schema | {"type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def integer_parameter(name: str, *, minimum: int, maximum: int, description: str = "") -> OpenApiParameter:
    """Return an optional integer query parameter within [minimum, maximum]
    (``lab.api.pagination.int_param`` answers 400 outside it)."""
    schema = {"type": "integer", "minimum": minimum, "maximum": maximum}
    return OpenApiParameter(name, schema, description=description)


def limit_parameter(*, default: int = 20, maximum: int = 100) -> OpenApiParameter:
    """Return the ``limit`` query parameter of a list: items per page."""
    return integer_parameter("limit", minimum=1, maximum=maximum, description=f"items per page (default {default})")


def json_body(schema: Schema) -> dict[str, Schema]:
    """Return an ``@extend_schema(request=...)`` value: a JSON body described by ``schema``."""
    return {"application/json": schema}


STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}
BOOLEAN: Schema = {"type": "boolean"}
TIMESTAMP: Schema = {"type": "string", "format": "date-time", "description": "ISO 8601 UTC (2026-11-29T22:16:31Z)"}
MONEY: Schema = {"type": "string", "pattern": r"^-?[0-9]+\.[0-9]+$", "description": "USD as a decimal string"}
FREE_OBJECT: Schema = {"type": "object", "additionalProperties": True}

FIELD_ERROR = component(
    "FieldError",
    obj(
        {"param": nullable(STRING), "code": STRING, "message": STRING},
        description="One problem with one field; param is a dotted path (env.0.id).",
    ),
)
ERROR = component(
    "Error",
    obj(
        {
            "error": obj(
                {
                    "type": {"type": "string", "enum": sorted({*ERROR_TYPES.values(), "api_error"})},
                    "code": STRING,
                    "message": STRING,
                    "param": nullable(STRING),
                    "errors": {"type": "array", "items": FIELD_ERROR},
                }
            )
        },
        description="Every error answer: param is the first bad field, errors lists every problem found.",
    ),
)


# --- what every operation shares ----------------------------------------------------------------

_ERROR_DESCRIPTIONS = {
    "400": "invalid_request or invalid_spec",
    "401": "invalid_api_key",
    "403": "insufficient_scope",
    "404": "not_found: missing, or another tenant's",
    "409": "idempotency_conflict or invalid_state",
    "413": "request_too_large",
    "415": "unsupported_media_type",
    "429": "rate_limited",
}
_IDEMPOTENCY_KEY = {
    "in": "header",
    "name": "Idempotency-Key",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    "description": "Replays the first answer of this key (per project, 24 h); another body with it is a 409.",
}
_PATH_PARAMETER = re.compile(r"\{[^}]+\}")
_NO_NUL = r"^[^\x00]*$"


def _error_statuses(method: str, path: str, operation: Schema) -> list[str]:
    """Return the error statuses ``operation`` can answer under docs/api.md "Conventions"."""
    authenticated = bool(operation.get("security"))
    parameters = operation.get("parameters", [])
    has_body = "requestBody" in operation
    statuses = set()
    if parameters or has_body or method == "post":
        statuses.add("400")
    if authenticated:
        statuses |= {"401", "403", "429"}
    if _PATH_PARAMETER.search(path) or any(parameter["name"] == "after" for parameter in parameters):
        statuses.add("404")
    if authenticated and method in ("post", "patch", "delete"):
        statuses.add("409")
    if has_body:
        statuses |= {"413", "415"}
    return sorted(statuses)


def _error_response(status: str) -> Schema:
    response: Schema = {
        "description": _ERROR_DESCRIPTIONS.get(status, "error"),
        "content": {"application/json": {"schema": ERROR}},
    }
    if status == "429":
        response["headers"] = {"Retry-After": {"required": True, "schema": INTEGER, "description": "seconds"}}
    return response


def _links(paths: dict[str, dict[str, Schema]]) -> None:
    """Link each create answer to the operations on its new object (see the module docstring)."""
    for path, operations in paths.items():
        created = operations.get("post", {}).get("responses", {}).get("201")
        if created is None or _PATH_PARAMETER.search(path):
            continue
        links = {}
        for other_path, other_operations in paths.items():
            rest = other_path.removeprefix(path + "/")
            if rest == other_path or not rest.startswith("{"):
                continue
            names = _PATH_PARAMETER.findall(other_path)
            if len(names) != 1:
                continue
            for other in other_operations.values():
                links[other["operationId"]] = {
                    "operationId": other["operationId"],
                    "parameters": {names[0][1:-1]: "$response.body#/id"},
                }
        if links:
            created["links"] = links


def postprocess_lab_schema(result: Schema, generator, request, public: bool) -> Schema:
    """drf-spectacular postprocessing hook: add the components, error responses,
    ``Idempotency-Key`` headers, empty query values, required POST bodies and create links
    (module docstring)."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(copy.deepcopy(_COMPONENTS))
    paths = result.get("paths", {})
    for path, operations in paths.items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for status in _error_statuses(method, path, operation):
                responses.setdefault(status, _error_response(status))
            if method == "post" and "requestBody" in operation:
                operation["requestBody"]["required"] = True
            if method == "post" and operation.get("security"):
                operation.setdefault("parameters", []).append(dict(_IDEMPOTENCY_KEY))
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "query":
                    parameter["allowEmptyValue"] = True
                schema = parameter.get("schema", {})
                if parameter["in"] in ("query", "path") and schema.get("type") == "string" and "enum" not in schema:
                    schema.setdefault("pattern", _NO_NUL)
    _links(paths)
    return result
