"""Kubernetes name formats (k8s.io/apimachinery/pkg/util/validation) for the fake API server.

Each check returns the list of messages the real helper returns, word for word: callers put
them into ``Invalid value`` errors that tests and users match on.
"""

from __future__ import annotations

from neuron_dra.common import names

__all__ = [
    "is_c_identifier",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "is_path_segment",
    "is_qualified_name",
    "is_valid_label_value",
]


_DNS1123_LABEL_FMT = names.DNS1123_LABEL_FMT
_DNS1123_SUBDOMAIN_FMT = names.DNS1123_SUBDOMAIN_FMT
_QUALIFIED_NAME_FMT = names.QUALIFIED_NAME_FMT
_LABEL_VALUE_FMT = names.LABEL_VALUE_FMT
_C_IDENTIFIER_FMT = names.C_IDENTIFIER_FMT

_DNS1123_LABEL_RE = names.DNS1123_LABEL_RE
_DNS1123_SUBDOMAIN_RE = names.DNS1123_SUBDOMAIN_RE
_QUALIFIED_NAME_RE = names.QUALIFIED_NAME_RE
_LABEL_VALUE_RE = names.LABEL_VALUE_RE
_C_IDENTIFIER_RE = names.C_IDENTIFIER_RE

_QUALIFIED_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    # The real helper joins examples with ",  or " (two spaces); callers match on the text.
    shown = ",  or ".join(f"'{e}'" for e in examples)
    prefix = f"e.g. {shown}, " if examples else ""
    return f"{msg} ({prefix}regex used for validation is '{fmt}')"


def _max_len(n: int) -> str:
    return f"must be no more than {n} characters"


def is_dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append(_max_len(63))
    if not _DNS1123_LABEL_RE.fullmatch(value):
        errs.append(
            _regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
                "'-', and must start and end with an alphanumeric character",
                _DNS1123_LABEL_FMT,
                "my-name",
                "123-abc",
            )
        )
    return errs


def is_dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append(_max_len(253))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errs.append(
            _regex_error(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character",
                _DNS1123_SUBDOMAIN_FMT,
                "example.com",
            )
        )
    return errs


def is_qualified_name(value: str) -> list[str]:
    """Label keys, annotation keys, finalizers: ``[prefix/]name``."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in is_dns1123_subdomain(prefix))
    else:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + _max_len(63))
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        errs.append(
            "name part "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errs


def is_valid_label_value(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append(_max_len(63))
    if not _LABEL_VALUE_RE.fullmatch(value):
        errs.append(
            _regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character",
                _LABEL_VALUE_FMT,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errs


def is_c_identifier(value: str) -> list[str]:
    if _C_IDENTIFIER_RE.fullmatch(value):
        return []
    return [
        _regex_error(
            "a valid C identifier must start with alphabetic character or '_', followed by a "
            "string of alphanumeric characters or '_'",
            _C_IDENTIFIER_FMT,
            "my_name",
            "MY_NAME",
            "MyName",
        )
    ]


def is_path_segment(value: str) -> list[str]:
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in value]
