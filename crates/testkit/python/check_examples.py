"""Validates every example in an OpenAPI 3.1 document against the schema it illustrates.

openapi-spec-validator checks the document's structure, not that its examples are true.
Usage: check_examples.py DOCUMENT.json; prints each wrong example and exits 1 if any.
"""

import json
import sys

import jsonschema

SCHEMA_KEYS = {"type", "$ref", "properties", "enum", "pattern", "oneOf", "anyOf", "allOf", "items"}


def check(doc):
    components = doc.get("components", {})
    errors = []

    def validate(where, schema, example):
        root = dict(schema) if isinstance(schema, dict) else {"const": schema}
        root["components"] = components
        for error in jsonschema.Draft202012Validator(root).iter_errors(example):
            errors.append(f"{where}: example {example!r}: {error.message}")

    def walk(node, where):
        if isinstance(node, dict):
            if "example" in node:
                if "schema" in node:
                    validate(where, node["schema"], node["example"])
                elif SCHEMA_KEYS & node.keys():
                    schema = {k: v for k, v in node.items() if k not in ("example", "examples")}
                    validate(where, schema, node["example"])
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}/{i}")

    walk(doc, "#")
    return errors


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        doc = json.load(f)
    errors = check(doc)
    for error in errors:
        print(error)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
