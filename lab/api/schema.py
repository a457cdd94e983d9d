"""OpenAPI generation details shared by every endpoint."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema


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
