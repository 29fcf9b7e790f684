"""The node's taints at registration, written as the kubelet's --register-with-taints takes them:
"<key>=<value>:<effect>" or "<key>:<effect>"."""

from __future__ import annotations

from edgelet.podconfig.validation import label_value_error, qualified_name_error

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def parse_taint(text: str) -> dict[str, str]:
    """{"key", "value"?, "effect"} of one taint; ValueError says what is wrong."""
    spec, colon, effect = text.rpartition(":")
    if not colon:
        raise ValueError(f'{text!r} is not "<key>=<value>:<effect>" or "<key>:<effect>"')
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"{text!r}: effect {effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
    key, equals, value = spec.partition("=")
    if problem := qualified_name_error(key):
        raise ValueError(f"{text!r}: key: {problem}")
    if equals and (problem := label_value_error(value)):
        raise ValueError(f"{text!r}: value: {problem}")
    return {"key": key, **({"value": value} if value else {}), "effect": effect}


def taint_error(text: str) -> str | None:
    try:
        parse_taint(text)
    except ValueError as err:
        return str(err)
    return None
