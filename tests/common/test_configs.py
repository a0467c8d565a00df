"""Opaque config decoding: strict, and every rejection tells the user what to change."""

from __future__ import annotations

from typing import Any

import pytest
from neuron_dra.common.constants import CONFIG_API_VERSION, CONFIG_API_VERSIONS_ACCEPTED
from neuron_dra.common.models.configs import (
    ConfigError,
    NeuronConfig,
    UltraServerConfig,
    decode_opaque_config,
    encode_opaque_config,
)


@pytest.mark.parametrize("api_version", CONFIG_API_VERSIONS_ACCEPTED)
def test_every_accepted_api_version_decodes(api_version: str) -> None:
    cfg = decode_opaque_config(
        {"apiVersion": api_version, "kind": "NeuronConfig", "logicalNeuronCore": 1}
    )
    assert cfg == NeuronConfig(logical_neuron_core=1)


def test_seed_ultraserver_config_decodes() -> None:
    cfg = decode_opaque_config(
        {
            "apiVersion": "neuron.aws.com/v1alphav1",
            "kind": "UltraServerConfig",
            "ultraserverMode": 4,
        }
    )
    assert isinstance(cfg, UltraServerConfig)
    assert cfg.ultraserver_mode == 4


def _neuron(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": CONFIG_API_VERSION, "kind": "NeuronConfig", **fields}


@pytest.mark.parametrize(
    ("parameters", "message", "field"),
    [
        (
            _neuron(logicalNeuronCores=1),
            'unknown field "logicalNeuronCores" in NeuronConfig (known fields: logicalNeuronCore)',
            "logicalNeuronCores",
        ),
        (_neuron(logicalNeuronCore=3), "logicalNeuronCore must be 1 or 2, got 3", None),
        (
            _neuron(logicalNeuronCore="1"),
            'logicalNeuronCore must be an integer, got string "1"',
            "logicalNeuronCore",
        ),
        (
            _neuron(logicalNeuronCore=True),
            "logicalNeuronCore must be an integer, got boolean true",
            "logicalNeuronCore",
        ),
        (_neuron(), 'NeuronConfig requires field "logicalNeuronCore"', "logicalNeuronCore"),
        (
            {"apiVersion": CONFIG_API_VERSION, "kind": "Foo"},
            'unsupported kind "Foo" (expected NeuronConfig or UltraServerConfig)',
            "kind",
        ),
        (
            {"apiVersion": CONFIG_API_VERSION, "kind": "UltraServerConfig", "ultraserverMode": 3},
            "ultraserverMode must be 1, 2 or 4, got 3",
            None,
        ),
    ],
)
def test_rejections_name_the_field(
    parameters: dict[str, Any], message: str, field: str | None
) -> None:
    with pytest.raises(ConfigError) as err:
        decode_opaque_config(parameters)
    assert str(err.value) == message
    if field is not None:
        assert err.value.field == field


def test_value_error_reports_field() -> None:
    with pytest.raises(ConfigError) as err:
        decode_opaque_config(_neuron(logicalNeuronCore=3))
    assert err.value.field == "logicalNeuronCore"


@pytest.mark.parametrize("api_version", [None, "neuron.aws.com/v2", "v1"])
def test_unknown_api_version_says_which_to_use(api_version: str | None) -> None:
    params = {"kind": "NeuronConfig", "logicalNeuronCore": 1}
    if api_version is not None:
        params["apiVersion"] = api_version
    with pytest.raises(ConfigError, match=r"use neuron\.aws\.com/v1") as err:
        decode_opaque_config(params)
    assert err.value.field == "apiVersion"


def test_non_object_parameters_rejected() -> None:
    with pytest.raises(ConfigError, match="must be an object"):
        decode_opaque_config(["logicalNeuronCore", 1])


def test_snake_case_field_is_unknown() -> None:
    # populate_by_name must not leak into user input: only the documented spelling counts.
    with pytest.raises(ConfigError, match='unknown field "logical_neuron_core"'):
        decode_opaque_config(_neuron(logical_neuron_core=1))


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    "config", [NeuronConfig(logical_neuron_core=2), UltraServerConfig(ultraserver_mode=2)]
)
def test_encode_is_canonical_and_round_trips(config: NeuronConfig | UltraServerConfig) -> None:
    encoded = encode_opaque_config(config)
    assert encoded["apiVersion"] == CONFIG_API_VERSION
    assert encoded["kind"] == type(config).__name__
    assert decode_opaque_config(encoded) == config


def test_encode_exact_shape() -> None:
    assert encode_opaque_config(UltraServerConfig(ultraserver_mode=4)) == {
        "apiVersion": "neuron.aws.com/v1",
        "kind": "UltraServerConfig",
        "ultraserverMode": 4,
    }
