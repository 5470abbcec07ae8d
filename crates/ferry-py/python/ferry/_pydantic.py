"""pydantic (v2) support for Ferry's metadata types, without depending on
pydantic: pydantic calls a class's ``__get_pydantic_core_schema__`` when a
model has a field of that type, and only then is ``pydantic_core``
imported. The field then validates from the class itself or from the dict
its ``model_dump()`` gives (or that dict as JSON), and dumps to that dict,
so a model round-trips through ``model_dump`` / ``model_validate`` and
``model_dump_json`` / ``model_validate_json`` exactly. No
``arbitrary_types_allowed`` is needed.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Type, TypeVar

T = TypeVar("T")


def core_schema_for(
    cls: Type[T],
    from_dict: Callable[[Dict[str, Any]], T],
    to_dict: Callable[[T], Dict[str, Any]],
) -> Any:
    """The pydantic-core schema of `cls`: validated by `from_dict` (from a
    dict, in Python or from JSON; an instance passes as it is), serialized by
    `to_dict`."""
    cs: Any = importlib.import_module("pydantic_core").core_schema

    def validate_dict(value: Dict[str, Any]) -> T:
        try:
            return from_dict(value)
        except TypeError as e:
            # pydantic reports ValueErrors as validation errors; a TypeError
            # would escape it.
            raise ValueError(str(e)) from None

    def validate_python(value: Any) -> T:
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return validate_dict(value)
        raise ValueError(
            f"expected a {cls.__name__} or the dict its model_dump() gives, "
            f"not {type(value).__name__}"
        )

    def serialize(value: Any) -> Any:
        return to_dict(value) if isinstance(value, cls) else value

    dict_schema = cs.dict_schema(keys_schema=cs.str_schema())
    return cs.json_or_python_schema(
        json_schema=cs.no_info_after_validator_function(validate_dict, dict_schema),
        python_schema=cs.no_info_plain_validator_function(validate_python),
        serialization=cs.plain_serializer_function_ser_schema(serialize, return_schema=dict_schema),
    )


def json_schema_for(
    cls: type, schema: Any, handler: Any, extra: Dict[str, Any]
) -> Dict[str, Any]:
    """The JSON schema of `cls` (an object), for ``model_json_schema()``."""
    result: Dict[str, Any] = dict(handler(schema))
    result.update(title=cls.__name__, **extra)
    return result
