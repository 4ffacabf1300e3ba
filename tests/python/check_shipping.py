"""Offline checks of what ships, for crates/countersign/tests/it/container.rs.

    check_shipping.py schema SCHEMA DOCUMENT   the validation errors (a JSON list, [] when valid)
    check_shipping.py yaml FILE                the YAML document as JSON

The schema check is the reference implementation's (jsonschema), with the schema's own
draft and format checking on, as the MCP Registry validates a server.json.
"""

import json
import sys


def schema(schema_path, document_path):
    import jsonschema

    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    with open(document_path, encoding="utf-8") as f:
        document = json.load(f)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    errors = [
        {"path": "/".join(str(p) for p in e.absolute_path), "message": e.message}
        for e in validator.iter_errors(document)
    ]
    json.dump(errors, sys.stdout)


def yaml_as_json(path):
    import yaml

    with open(path, encoding="utf-8") as f:
        json.dump(yaml.safe_load(f), sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "schema":
        schema(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "yaml":
        yaml_as_json(sys.argv[2])
    else:
        sys.exit(f"unknown check {sys.argv[1]}")
