"""Whether a change fits the configured resources (`Validator`). Pure code."""

from __future__ import annotations

from collections.abc import Iterable

from changefeed.errors import ChangeError
from changefeed.protocol import Resource
from publisher.bucket.values.changes import MAX_ID_BYTES, Change

KINDS_REMEMBERED = 4096
"""(resource, sub-resources) pairs a validator remembers as fitting."""


class Validator:
    """Checks changes against `resources` (None: any resource and sub-resource names)."""

    def __init__(self, resources: Iterable[Resource] | None) -> None:
        self.resources = {r.resource: r for r in resources} if resources is not None else None
        self._fitting: set[tuple[str, tuple[str, ...]]] = set()
        """(resource, sub-resources) pairs found fitting."""

    def validate(self, change: Change) -> None:
        """Raise ChangeError if `change` does not fit the configured resources.

        A (resource, sub-resources) pair that fitted once is remembered (up to KINDS_REMEMBERED
        of them), so a writer of many changes checks each kind once, and each change's id."""
        id = change.changed_resource_id
        if not isinstance(id, str) or not id:
            raise ChangeError("changedResourceId must be a non-empty string")
        if len(id) * 4 > MAX_ID_BYTES and len(id.encode()) > MAX_ID_BYTES:
            raise ChangeError(f"changedResourceId longer than {MAX_ID_BYTES} bytes")
        kind = (change.resource, change.sub_resources)
        hashable = type(change.sub_resources) is tuple
        try:
            if hashable and kind in self._fitting:
                return
        except TypeError:  # a sub-resource that is not even hashable: refused below
            hashable = False
        if not change.sub_resources or not all(isinstance(s, str) for s in change.sub_resources):
            raise ChangeError("a change needs at least one sub-resource name")
        if self.resources is not None:
            resource = self.resources.get(change.resource)
            if resource is None:
                known = ", ".join(sorted(self.resources))
                raise ChangeError(f"unknown resource {change.resource!r} (known: {known})")
            unknown = [s for s in change.sub_resources if s not in resource.sub_resources]
            if unknown:
                raise ChangeError(
                    f"unknown sub-resource(s) {', '.join(map(repr, unknown))} of "
                    f"{change.resource!r} (known: {', '.join(resource.sub_resources)})"
                )
        if hashable and len(self._fitting) < KINDS_REMEMBERED:
            self._fitting.add(kind)

    def validate_all(self, changes: Iterable[Change]) -> None:
        """`validate` each of `changes`, in order (the first that does not fit raises). A change
        whose resource and sub-resources are the very objects of the change checked before it
        (a bulk writer's changes of one kind share them) has only its id checked."""
        validate = self.validate
        resource: object = None
        subs: object = None
        for change in changes:
            id = change.changed_resource_id
            if (
                change.sub_resources is subs and change.resource is resource
                and type(id) is str and id and len(id) * 4 <= MAX_ID_BYTES
            ):
                continue
            validate(change)
            if type(change.sub_resources) is tuple:  # immutable: it fits from now on
                resource, subs = change.resource, change.sub_resources


__all__ = ["KINDS_REMEMBERED", "Validator"]
