"""The device manager's record for `edgelet describe node`: each resource's capacity and allocatable and the plugin
serving it, as the agent last saw them (rewritten on every change; a display snapshot, not a checkpoint)."""

from __future__ import annotations

import os

import orjson

RECORD_NAME = "devices.json"  # under the state directory


def record_path(state_dir: str) -> str:
    return os.path.join(state_dir, RECORD_NAME)


def read_record(state_dir: str) -> dict:
    """The resources as last recorded ({} when there is no readable record)."""
    try:
        with open(record_path(state_dir), "rb") as file:
            record = orjson.loads(file.read())
    except (OSError, orjson.JSONDecodeError):
        return {}
    resources = record.get("resources") if isinstance(record, dict) else None
    return resources if isinstance(resources, dict) else {}
