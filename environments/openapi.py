"""OpenAPI components of the dataset bodies (docs/environments.md "Datasets loaded by name"), as
``environments/serializers.py`` builds them."""

from __future__ import annotations

from lab.api.schema import INTEGER, STRING, TIMESTAMP, component, list_component, obj

DATASET = component(
    "Dataset",
    obj(
        {
            "id": STRING | {"description": "<owner>/<name>, the name load_dataset is called with"},
            "object": {"const": "dataset"},
            "owner": STRING,
            "name": STRING,
            "filename": STRING | {"description": "the file pushed"},
            "files": {"type": "array", "items": obj({"path": STRING, "size_bytes": INTEGER})},
            "sha256": STRING | {"description": "of the stored tar"},
            "size_bytes": INTEGER | {"description": "of the stored tar"},
            "created_at": TIMESTAMP,
            "updated_at": TIMESTAMP | {"description": "its last push"},
        },
        description="A dataset snapshot the organization pushed (lab datasets push), read offline by builds and jobs.",
    ),
)
DATASET_LIST = list_component("Dataset", "The organization's pushed datasets.")
