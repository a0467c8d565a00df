"""Kubernetes building blocks shared by our custom resources.

The ``rules``/``immutable``/``list_map`` helpers attach Kubernetes schema keywords
(``x-kubernetes-*``) to pydantic fields via ``json_schema_extra``. ``crdgen`` copies them into
the CRD, so the model is the one place a constraint is written down.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from neuron_dra.common.names import DNS1123_SUBDOMAIN_FMT, QUALIFIED_NAME_FMT
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from pydantic.alias_generators import to_camel

JsonDict = dict[str, Any]

#: RFC 1123 DNS subdomain, as Kubernetes uses for object names.
DNS_SUBDOMAIN_PATTERN = "^" + DNS1123_SUBDOMAIN_FMT + "$"
DNS_SUBDOMAIN_MAX_LENGTH = 253
#: Node names are DNS subdomains too.
NODE_NAME_MAX_LENGTH = DNS_SUBDOMAIN_MAX_LENGTH


def rule(
    expression: str,
    message: str,
    *,
    field_path: str | None = None,
    reason: str | None = None,
) -> JsonDict:
    """One ``x-kubernetes-validations`` entry (a CEL rule and the message users see)."""
    entry: JsonDict = {"rule": expression, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    if reason is not None:
        entry["reason"] = reason
    return entry


def rules(*entries: JsonDict, **extra: Any) -> JsonDict:
    """``json_schema_extra`` carrying CEL rules plus any other schema keywords."""
    return {"x-kubernetes-validations": list(entries), **extra}


def immutable(field: str) -> JsonDict:
    """Transition rule: once set, the value may not change (Kubernetes only checks it on
    update, when both the old and the new value exist)."""
    return rule("self == oldSelf", f"{field} is immutable; delete and recreate the object")


def list_map(*keys: str) -> JsonDict:
    """A list whose items are identified by ``keys`` (server-side apply merges by them)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


LIST_SET: JsonDict = {"x-kubernetes-list-type": "set"}


class CamelModel(BaseModel):
    """Python snake_case attributes, Kubernetes camelCase on the wire."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        validate_assignment=True,
    )

    def to_dict(self) -> JsonDict:
        """The wire form: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class ObjectMeta(CamelModel):
    """The parts of metav1.ObjectMeta our code reads; anything else is kept as is."""

    model_config = ConfigDict(extra="allow")

    name: str = ""
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[JsonDict] = Field(default_factory=list)


NonNegativeInt = Annotated[StrictInt, Field(ge=0)]


class Condition(CamelModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    # The standard shape, so generic tooling such as ``kubectl wait --for=condition`` works.

    model_config = ConfigDict(extra="forbid")

    type: str = Field(
        max_length=316,
        pattern=f"^({DNS1123_SUBDOMAIN_FMT}/)?({QUALIFIED_NAME_FMT})$",
    )
    status: Literal["True", "False", "Unknown"]
    observed_generation: NonNegativeInt | None = None
    last_transition_time: datetime
    reason: str = Field(
        min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    )
    message: str = Field(max_length=32768)


#: ``json_schema_extra`` for a ``conditions`` list: a map keyed by condition type.
CONDITIONS_LIST: JsonDict = {**list_map("type"), "maxItems": 16}
