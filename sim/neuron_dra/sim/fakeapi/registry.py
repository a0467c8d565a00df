"""The resource type table of the fake API server: every served resource (built-in or
from a CustomResourceDefinition) by group/version/plural and by apiVersion/kind, and the
groups with their versions (preferred first) that discovery and OpenAPI are made from."""

from __future__ import annotations

from collections.abc import Iterable

from .resource_types import ResourceType


class Registry:
    """Lookup by group/version/plural and by apiVersion/kind."""

    def __init__(self, types: Iterable[ResourceType] = ()) -> None:
        self._by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        self._by_gvk: dict[tuple[str, str, str], ResourceType] = {}
        # group → its versions in registration order (the first is the preferred one).
        self._groups: dict[str, list[str]] = {}
        for rt in types:
            self.add(rt)

    # -- mutation
    def add(self, rt: ResourceType) -> None:
        self._by_gvr[(rt.group, rt.version, rt.plural)] = rt
        self._by_gvk[(rt.group, rt.version, rt.kind)] = rt
        versions = self._groups.setdefault(rt.group, [])
        if rt.version not in versions:
            versions.append(rt.version)

    def remove_crd(self, crd_name: str) -> list[ResourceType]:
        gone = [rt for rt in self._by_gvr.values() if rt.crd == crd_name]
        for rt in gone:
            del self._by_gvr[(rt.group, rt.version, rt.plural)]
            self._by_gvk.pop((rt.group, rt.version, rt.kind), None)
        for name, versions in list(self._groups.items()):
            kept = [v for v in versions
                    if any(k[0] == name and k[1] == v for k in self._by_gvr)]
            if kept:
                self._groups[name] = kept
            else:
                del self._groups[name]
        return gone

    # -- lookup
    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_gvr.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        return self._by_gvk.get((group, version, kind))

    def types(self) -> list[ResourceType]:
        return list(self._by_gvr.values())

    def versions_of(self, group: str, plural: str) -> list[ResourceType]:
        return [rt for (g, _, p), rt in self._by_gvr.items() if g == group and p == plural]

    def group_known(self, group: str, version: str) -> bool:
        versions = self._groups.get(group)
        return versions is not None and version in versions

    def group_versions(self, group: str) -> list[str] | None:
        """The served versions of ``group``, the preferred one first (None: no such group)."""
        return self._groups.get(group)

    def groups(self) -> list[tuple[str, list[str]]]:
        """Every group (the core group is ``""``) with its versions, sorted by name."""
        return sorted(self._groups.items())

    def served(self, group: str, version: str) -> list[ResourceType]:
        """The resources of one group/version, sorted by plural (discovery's order)."""
        return [rt for (g, v, _), rt in sorted(self._by_gvr.items())
                if g == group and v == version]
