"""TypeScript declarations of the REST API's schemas, from the OpenAPI document.

The JavaScript client (``clients/js``) types every request and answer with
these, so they follow the server: ``python -m rankd.docs`` writes them to
``clients/js/src/api.d.ts`` and a test fails when the committed file differs.
"""

from __future__ import annotations

import json
import re
from typing import Any

_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


def _comment(text: str | None, indent: str) -> str:
    if not text:
        return ""
    lines = text.replace("*/", "*\\/").splitlines()
    if len(lines) == 1:
        return f"{indent}/** {lines[0]} */\n"
    return f"{indent}/**\n" + "".join(f"{indent} * {line}\n" for line in lines) + f"{indent} */\n"


def _key(name: str) -> str:
    return name if _IDENTIFIER.fullmatch(name) else json.dumps(name)


def type_of(schema: dict[str, Any], indent: str = "") -> str:
    """The TypeScript type of a JSON schema (the subset the document uses)."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "enum" in schema:
        return " | ".join(json.dumps(value) for value in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    if "allOf" in schema:
        joined = " & ".join(type_of(part, indent) for part in schema["allOf"])
        # A schema made stricter where used: every field present (a response's config).
        return f"Required<{joined}>" if schema.get("required") else joined
    for combinator in ("anyOf", "oneOf"):
        if combinator in schema:
            return " | ".join(dict.fromkeys(type_of(part, indent)
                                            for part in schema[combinator]))
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(type_of({**schema, "type": one}, indent) for one in kind)
    if kind in ("integer", "number"):
        return "number"
    if kind in ("string", "boolean", "null"):
        return kind
    if kind == "array":
        item = type_of(schema.get("items", {}), indent)
        return f"Array<{item}>"
    if kind == "object" or "properties" in schema:
        return _object(schema, indent)
    return "unknown"


def _object(schema: dict[str, Any], indent: str) -> str:
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    if not properties:
        if isinstance(extra, dict):
            return f"Record<string, {type_of(extra, indent)}>"
        return "Record<string, unknown>"
    required = set(schema.get("required", []))
    inner = indent + "  "
    lines = ["{\n"]
    for name, part in properties.items():
        lines.append(_comment(part.get("description"), inner))
        optional = "" if name in required else "?"
        lines.append(f"{inner}{_key(name)}{optional}: {type_of(part, inner)};\n")
    lines.append(f"{indent}}}")
    return "".join(lines)


def typescript(document: dict[str, Any]) -> str:
    """``api.d.ts``: one exported type per schema of ``components/schemas``."""
    info = document["info"]
    lines = [f"// The rankd REST API's schemas (v{info['version']}), generated from its OpenAPI\n"
             "// document by `python -m rankd.docs`; do not edit by hand.\n"]
    for name, schema in document["components"]["schemas"].items():
        lines.append("\n" + _comment(schema.get("description"), ""))
        body = type_of({k: v for k, v in schema.items() if k != "description"})
        if body.startswith("{"):
            lines.append(f"export interface {name} {body}\n")
        else:
            lines.append(f"export type {name} = {body};\n")
    return "".join(lines)
