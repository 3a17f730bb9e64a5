"""The TFJob API's structure as a JSON Schema, read from the installed SDK's models.

The training operator's CRD (`kubeflow.org_tfjobs.yaml`) is generated from the
same Go types as the `kubeflow-training` SDK's models (`KubeflowOrgV1TFJob`, and
the Kubernetes client's `V1PodTemplateSpec` and below). This module walks those
models' `openapi_types`, `attribute_map` and required constructor arguments, and
builds a draft-7 schema with their JSON names, types and required fields. Unknown
fields are refused, as `kubectl apply` does (its `--validate=strict` default).

It needs the `kubernetes` extra (`pip install 'tfdist[kubernetes]'`) and
jsonschema; nothing here contacts a cluster.
"""

import functools
import re

_REQUIRED = re.compile(r"Invalid value for `(\w+)`, must not be `None`")
_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict\((\w+), (.+)\)$")
# Quantities are int-or-string in the API (`cpu: 6` and `cpu: "6"`); the Kubernetes client
# types a pod's resources as strings.
_QUANTITY = {"type": ["string", "integer", "number"]}
_SCALARS = {
    "Quantity": _QUANTITY,
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "datetime": {"type": "string"},
    "date": {"type": "string"},
    "bytearray": {"type": "string"},
    "object": {},  # int-or-string, or free-form
}
_QUANTITY_FIELDS = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests")}
ROOT = "KubeflowOrgV1TFJob"


def _model_class(name: str):
    from kubeflow.training import models as training_models  # pylint: disable=g-import-not-at-top
    from kubernetes.client import models as kubernetes_models  # pylint: disable=g-import-not-at-top

    for module in (training_models, kubernetes_models):
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(f"no model {name!r} in kubeflow.training or kubernetes.client")


def required_fields(model) -> list[str]:
    """The Python names a model's constructor refuses to leave unset, in its order."""
    given = {}
    for _ in range(len(model.openapi_types) + 1):
        try:
            model(**given)
        except ValueError as error:
            match = _REQUIRED.search(str(error))
            if not match or match.group(1) in given:
                raise
            given[match.group(1)] = "set"
            continue
        return list(given)
    raise RuntimeError(f"{model.__name__}: required fields did not converge")


def _type_schema(type_name: str, definitions: dict) -> dict:
    if type_name in _SCALARS:
        return dict(_SCALARS[type_name])
    match = _LIST.match(type_name)
    if match:
        return {"type": "array", "items": _type_schema(match.group(1), definitions)}
    match = _DICT.match(type_name)
    if match:
        return {"type": "object", "additionalProperties": _type_schema(match.group(2), definitions)}
    _define(type_name, definitions)
    return {"$ref": f"#/definitions/{type_name}"}


def _define(name: str, definitions: dict) -> None:
    if name in definitions:
        return
    definitions[name] = {}  # recursive types stop here
    model = _model_class(name)
    properties = {}
    for attribute, type_name in model.openapi_types.items():
        json_name = model.attribute_map[attribute]
        properties[json_name] = (
            {"type": "object", "additionalProperties": _QUANTITY}
            if (name, attribute) in _QUANTITY_FIELDS
            else _type_schema(type_name, definitions)
        )
    definitions[name] = {
        "type": "object",
        "properties": properties,
        "required": [model.attribute_map[field] for field in required_fields(model)],
        "additionalProperties": False,
    }


@functools.cache
def tfjob_schema() -> dict:
    """The draft-7 JSON Schema of a `kubeflow.org/v1` TFJob, from the SDK's models."""
    definitions: dict = {}
    _define(ROOT, definitions)
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$ref": f"#/definitions/{ROOT}",
        "definitions": definitions,
    }


def schema_errors(manifest) -> list[str]:
    """Each place the manifest breaks the TFJob API's structure, as `path: message`."""
    import jsonschema  # pylint: disable=g-import-not-at-top

    validator = jsonschema.Draft7Validator(tfjob_schema())
    errors = sorted(validator.iter_errors(manifest), key=lambda error: list(error.path))
    return [
        f"{'.'.join(str(part) for part in error.path) or '(top)'}: {error.message}"
        for error in errors
    ]
