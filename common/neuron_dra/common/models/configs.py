"""Opaque device configurations carried in ResourceClaims and DeviceClasses.

Users type these by hand inside ``opaque.parameters``, and a mistake only surfaces when the
pod is stuck in ContainerCreating. So decoding is strict (unknown fields and string-typed
numbers are rejected rather than guessed at) and every error names the offending field and
the value that would be accepted.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from neuron_dra.common.constants import (
    CONFIG_API_VERSION,
    CONFIG_API_VERSIONS_ACCEPTED,
    CONFIG_KIND_NEURON,
    CONFIG_KIND_ULTRASERVER,
)
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
)
from pydantic_core import ErrorDetails


class ConfigError(ValueError):
    """An opaque config the driver cannot use; the message says what to change.

    This is a permanent, user-caused error: retrying the same claim cannot succeed.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def one_of(field: str, allowed: tuple[int, ...]) -> AfterValidator:
    """Validator restricting an int to ``allowed`` with a message naming ``field``."""
    *head, last = (str(a) for a in allowed)
    words = f"{', '.join(head)} or {last}" if head else last

    def check(value: int) -> int:
        if value not in allowed:
            raise ValueError(f"{field} must be {words}, got {value}")
        return value

    return AfterValidator(check)


LogicalNeuronCore = Annotated[StrictInt, one_of("logicalNeuronCore", (1, 2))]
UltraServerMode = Annotated[StrictInt, one_of("ultraserverMode", (1, 2, 4))]


class _OpaqueConfig(BaseModel):
    # apiVersion/kind are checked (and stripped) by decode_opaque_config before validation,
    # so the models hold only the settings.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    KIND: ClassVar[str]


class NeuronConfig(_OpaqueConfig):
    """Per-claim Neuron settings. ``logicalNeuronCore`` applies to Trn2/Trn3 only."""

    KIND = CONFIG_KIND_NEURON
    logical_neuron_core: LogicalNeuronCore = Field(alias="logicalNeuronCore")


class UltraServerConfig(_OpaqueConfig):
    """Use a node as part of an UltraServer group of ``ultraserverMode`` nodes (a node count)."""

    KIND = CONFIG_KIND_ULTRASERVER
    ultraserver_mode: UltraServerMode = Field(alias="ultraserverMode")


OpaqueConfig = NeuronConfig | UltraServerConfig

_KINDS: dict[str, type[NeuronConfig] | type[UltraServerConfig]] = {
    CONFIG_KIND_NEURON: NeuronConfig,
    CONFIG_KIND_ULTRASERVER: UltraServerConfig,
}


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r}"


def _known_fields(model: type[_OpaqueConfig]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _explain(model: type[_OpaqueConfig], error: ErrorDetails) -> ConfigError:
    """Turn one pydantic error into a message in the user's vocabulary (camelCase fields)."""
    field = str(error["loc"][0]) if error["loc"] else None
    kind = model.KIND
    known = ", ".join(_known_fields(model))
    match error["type"]:
        case "extra_forbidden":
            msg = f'unknown field "{field}" in {kind} (known fields: {known})'
        case "missing":
            msg = f'{kind} requires field "{field}"'
        case "value_error":
            # Our own validators already phrase the message; drop pydantic's prefix.
            msg = str(error["ctx"]["error"]) if "ctx" in error else error["msg"]
        case "int_type":
            msg = f"{field} must be an integer, got {_describe(error['input'])}"
        case _:
            msg = f"{field}: {error['msg']}"
    return ConfigError(msg, field=field)


def decode_opaque_config(parameters: Any) -> OpaqueConfig:
    """Decode ``opaque.parameters`` of a config addressed to our driver.

    Raises ConfigError for anything we would otherwise have to guess about.
    """
    if not isinstance(parameters, dict):
        raise ConfigError(f"opaque parameters must be an object, got {_describe(parameters)}")
    api_version = parameters.get("apiVersion")
    if api_version not in CONFIG_API_VERSIONS_ACCEPTED:
        accepted = ", ".join(CONFIG_API_VERSIONS_ACCEPTED)
        raise ConfigError(
            f"unsupported apiVersion {_describe(api_version)} (use {CONFIG_API_VERSION}; "
            f"also accepted: {accepted})",
            field="apiVersion",
        )
    kind = parameters.get("kind")
    model = _KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        shown = f'"{kind}"' if isinstance(kind, str) else _describe(kind)
        raise ConfigError(
            f"unsupported kind {shown} (expected {' or '.join(_KINDS)})", field="kind"
        )
    settings = {k: v for k, v in parameters.items() if k not in ("apiVersion", "kind")}
    try:
        return model.model_validate(settings, by_alias=True, by_name=False)
    except ValidationError as exc:
        # Report one problem: one clear instruction beats a wall of text, and the user sees
        # the next after fixing it. Unknown fields first: they are usually a misspelling of
        # the field that is then reported missing, and the misspelling is what to fix.
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        raise _explain(model, errors[0]) from None


def encode_opaque_config(config: OpaqueConfig) -> dict[str, Any]:
    """The canonical ``opaque.parameters`` for ``config`` (used in generated templates)."""
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": config.KIND,
        **config.model_dump(by_alias=True),
    }


__all__ = [
    "ConfigError",
    "LogicalNeuronCore",
    "NeuronConfig",
    "OpaqueConfig",
    "UltraServerConfig",
    "UltraServerMode",
    "decode_opaque_config",
    "encode_opaque_config",
    "one_of",
]
