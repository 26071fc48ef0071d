"""Check the package's dataclasses against the API's OpenAPI document.

    python check_schema.py http://127.0.0.1:3100/openapi.json   (or a file)

For each class named in rollout_fleet.types.SCHEMAS, its fields (snake_case of the JSON names) must be
exactly the schema's properties, each with the matching type: str/int/float/bool for string/integer/
number/boolean, Literal for const and enum, List and Dict for arrays and maps, a nested dataclass for
an object with properties (checked the same way), Optional with a default of None for a property the
schema does not require, Optional without a default for one that is required but may be null. Prints
every mismatch and exits 1 if there is any; prints what it checked and exits 0 if not.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import typing
import urllib.request
from typing import Any, Dict, List, Literal, Tuple, Union

from rollout_fleet import types as t


def load(source: str) -> Dict[str, Any]:
    if source.startswith("http://") or source.startswith("https://"):
        with urllib.request.urlopen(source, timeout=30) as response:
            doc: Dict[str, Any] = json.load(response)
            return doc
    with open(source, encoding="utf-8") as f:
        loaded: Dict[str, Any] = json.load(f)
        return loaded


class Checker:
    def __init__(self, doc: Dict[str, Any]) -> None:
        self.doc = doc
        self.problems: List[str] = []
        self.checked = 0

    def resolve(self, schema: Dict[str, Any]) -> Dict[str, Any]:
        while "$ref" in schema:
            node: Any = self.doc
            for part in schema["$ref"].lstrip("#/").split("/"):
                node = node[part]
            schema = node
        return schema

    def split_null(self, schema: Dict[str, Any]) -> Tuple[Dict[str, Any], bool]:
        """The schema without null, and whether null was allowed."""
        schema = self.resolve(schema)
        kind = schema.get("type")
        if isinstance(kind, list) and "null" in kind:
            rest = [k for k in kind if k != "null"]
            return dict(schema, type=rest[0] if len(rest) == 1 else rest), True
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and any(self.resolve(o).get("type") == "null" for o in options):
                rest = [o for o in options if self.resolve(o).get("type") != "null"]
                if len(rest) == 1:
                    return self.resolve(rest[0]), True
                return {key: rest}, True
        return schema, False

    def type_matches(self, where: str, tp: Any, schema: Dict[str, Any]) -> None:
        self.checked += 1
        schema = self.resolve(schema)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is Any:
            return
        if origin is Union:
            others = [a for a in args if a is not type(None)]
            inner, nullable = self.split_null(schema)
            if not nullable:
                self.problems.append("%s: Optional, but the schema does not allow null" % where)
            self.type_matches(where, others[0] if len(others) == 1 else Union[tuple(others)], inner)
            return
        _, nullable = self.split_null(schema)
        if nullable:
            self.problems.append("%s: the schema allows null; the annotation %r does not" % (where, tp))
            return
        kind = schema.get("type")
        if origin is Literal:
            allowed = [schema["const"]] if "const" in schema else schema.get("enum")
            if allowed is None or set(allowed) != set(args):
                self.problems.append("%s: Literal%r, the schema allows %r" % (where, list(args), allowed))
            return
        if tp is str:
            if kind != "string":
                self.problems.append("%s: str, the schema says %r" % (where, kind))
            return
        if tp is int:
            if kind != "integer":
                self.problems.append("%s: int, the schema says %r" % (where, kind))
            return
        if tp is float:
            if kind != "number":
                self.problems.append("%s: float, the schema says %r" % (where, kind))
            return
        if tp is bool:
            if kind != "boolean":
                self.problems.append("%s: bool, the schema says %r" % (where, kind))
            return
        if origin in (list, List):
            if kind != "array":
                self.problems.append("%s: List, the schema says %r" % (where, kind))
                return
            self.type_matches(where + "[]", args[0], schema.get("items", {}))
            return
        if origin in (dict, Dict):
            if kind != "object":
                self.problems.append("%s: Dict, the schema says %r" % (where, kind))
                return
            if args[1] is not Any:
                values = schema.get("additionalProperties")
                if not isinstance(values, dict):
                    self.problems.append("%s: Dict[str, %r], the schema has no additionalProperties schema" % (where, args[1]))
                    return
                self.type_matches(where + "{}", args[1], values)
            return
        if dataclasses.is_dataclass(tp):
            if kind != "object" or "properties" not in schema:
                self.problems.append("%s: %s, the schema is not an object with properties" % (where, tp.__name__))
                return
            self.dataclass_matches(where, tp, schema)
            return
        self.problems.append("%s: an annotation this check does not know: %r" % (where, tp))

    def dataclass_matches(self, where: str, cls: Any, schema: Dict[str, Any]) -> None:
        properties: Dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        hints = t.type_hints(cls)
        fields = {t.json_name(f.name): f for f in dataclasses.fields(cls) if f.metadata.get("json") is not False}
        for name in sorted(set(properties) - set(fields)):
            self.problems.append("%s: the schema has %s; %s has no field %s" % (where, name, cls.__name__, _snake(name)))
        for name in sorted(set(fields) - set(properties)):
            self.problems.append("%s: %s.%s is not in the schema" % (where, cls.__name__, fields[name].name))
        for name in sorted(set(fields) & set(properties)):
            f = fields[name]
            tp = hints[f.name]
            optional = typing.get_origin(tp) is Union and type(None) in typing.get_args(tp)
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            here = "%s.%s" % (where, name)
            if name in required:
                if has_default:
                    self.problems.append("%s: required by the schema, but has a default" % here)
                self.type_matches(here, tp, properties[name])
            else:
                if not optional or f.default is not None:
                    self.problems.append("%s: not required by the schema: expected Optional[...] = None" % here)
                    continue
                inner = [a for a in typing.get_args(tp) if a is not type(None)]
                _, nullable = self.split_null(properties[name])
                # Optional for absence; when the schema also allows null, the Optional covers that too.
                self.type_matches(here, tp if nullable else inner[0], properties[name])


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def main(argv: List[str]) -> int:
    doc = load(argv[1])
    schemas = doc["components"]["schemas"]
    checker = Checker(doc)
    for cls_name, schema_name in sorted(t.SCHEMAS.items()):
        if schema_name not in schemas:
            checker.problems.append("%s: the document has no schema %s" % (cls_name, schema_name))
            continue
        checker.dataclass_matches(schema_name, getattr(t, cls_name), checker.resolve(schemas[schema_name]))
    # The result route declares both media types and the events each carries.
    results = doc["paths"]["/v1/batches/{batchId}/results"]["get"]["responses"]["200"]["content"]
    for media in ("text/event-stream", "application/x-ndjson"):
        if media not in results:
            checker.problems.append("/v1/batches/{batchId}/results: no %s response" % media)
    declared = {o.get("$ref", "").rsplit("/", 1)[-1] for o in results.get("application/x-ndjson", {}).get("schema", {}).get("oneOf", [])}
    for name in ("ResultEvent", "GroupEvent", "EndEvent", "KeepAliveEvent"):
        if name not in declared:
            checker.problems.append("/v1/batches/{batchId}/results: NDJSON does not declare %s" % name)
    for problem in checker.problems:
        print("schema mismatch: " + problem)
    print("checked %d classes against %d schemas: %d types compared, %d mismatches" % (len(t.SCHEMAS), len(schemas), checker.checked, len(checker.problems)))
    return 1 if checker.problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
