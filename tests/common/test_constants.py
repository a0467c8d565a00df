"""Attribute and label names respect the Kubernetes limits they are published under."""

from __future__ import annotations

import re

import pytest
from neuron_dra.common import constants as c

C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ATTRIBUTES = [v for k, v in vars(c).items() if k.startswith("ATTR_") and isinstance(v, str)]


@pytest.mark.parametrize("name", ATTRIBUTES)
def test_attribute_names_are_short_c_identifiers(name: str) -> None:
    # Qualified names (Kubernetes' standard ones) are <DNS subdomain>/<C identifier>.
    domain, _, ident = name.rpartition("/")
    assert C_IDENTIFIER.match(ident)
    assert len(ident) <= c.MAX_ATTRIBUTE_ID_LENGTH
    assert domain in ("", c.STANDARD_ATTRIBUTE_DOMAIN)


def test_attribute_count_leaves_room_for_capacities_and_groups() -> None:
    # Every attribute, the two capacities and up to 6 devicegroup sizes on one device must fit.
    assert len(ATTRIBUTES) + 2 + 6 <= c.MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE


@pytest.mark.parametrize("size", [1, 4, 8, 16])
def test_device_group_attribute(size: int) -> None:
    name = c.device_group_attribute(size)
    assert name == f"resource.aws.com/devicegroup{size}_id"
    _domain, ident = name.split("/")
    assert C_IDENTIFIER.match(ident) and len(ident) <= c.MAX_ATTRIBUTE_ID_LENGTH


def test_device_group_attribute_rejects_zero() -> None:
    with pytest.raises(ValueError):
        c.device_group_attribute(0)


def test_names_and_labels() -> None:
    assert c.device_name(7) == "neurondevice7"
    assert c.LABEL_ULTRASERVER_SERVER_ID_4 == "neuron.amazonaws.com/ultraserver-server-id-4"
    assert c.format_ultraserver_modes([4, 1, 2, 2]) == "1_2_4"
    assert c.CRD_API_VERSION == "neuron.aws.com/v1beta1"
    assert c.CONFIG_API_VERSIONS_ACCEPTED[0] == c.CONFIG_API_VERSION


def test_device_index_reads_back_what_device_name_writes() -> None:
    for index in (0, 7, 15, 127):
        assert c.device_index(c.device_name(index)) == index
    for other in (
        "neuronnode",
        "neurondevice",
        "neurondevice03",
        "neurondevice-1",
        "gpu0",
        "neurondevice\u00b2",
        "neurondevice1a",
        "xneurondevice1",
    ):
        assert c.device_index(other) is None, other
