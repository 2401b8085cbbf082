#!/usr/bin/python3
"""Validates JSON documents against a JSON Schema (Debian's python3-jsonschema).

    validate_json.py SCHEMA FILE...      FILE may be - for standard input

Exits 1 naming the first violation of each invalid document, 0 when all are valid.
"""
import json
import sys

import jsonschema


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    failed = False
    for path in sys.argv[2:]:
        document = json.load(sys.stdin if path == "-" else open(path))
        for error in validator.iter_errors(document):
            where = "/".join(str(p) for p in error.absolute_path) or "(top)"
            print(f"{path}: {where}: {error.message}", file=sys.stderr)
            failed = True
            break
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
