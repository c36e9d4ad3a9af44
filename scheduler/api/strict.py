"""Input serializers that refuse what they do not know."""

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers


class Strict:
    """A serializer mixin (put it first) that refuses a field it does not know with a 400
    naming it: a misspelt limit (`rate_per_minute` for `rpm`) would otherwise be dropped
    without a word and the key made without it. Read-only fields are known, so what a GET
    answered may be sent back."""

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)  # type: ignore[misc]
        data = self.initial_data  # type: ignore[attr-defined]
        known = self.fields  # type: ignore[attr-defined]
        unknown = sorted(set(data) - set(known)) if isinstance(data, Mapping) else []
        if unknown:
            writable = ", ".join(name for name, f in known.items() if not f.read_only)
            raise serializers.ValidationError(
                {unknown[0]: f"unknown field; the fields here are {writable}"}
            )
        return attrs
