#!/usr/bin/env python3
"""Generate testdata/gateway/details.json: the expected `details` map for MCP tool-call
arguments.

Regenerate (needs the `rfc8785` package, pinned in tests/python/requirements.txt):

    python3 -m venv /tmp/venv-helper && /tmp/venv-helper/bin/pip install rfc8785==0.1.4
    /tmp/venv-helper/bin/python testdata/gateway/make_details.py > testdata/gateway/details.json

The script reads nothing and writes the JSON array to stdout.

The rule under test: the tool call's `arguments` object is flattened to its leaves. A leaf
is a string, number, boolean or null, or an empty object or empty array (so nothing is
lost). Each leaf's key is its RFC 6901 JSON Pointer from the arguments object: "~" in a key
becomes "~0", "/" becomes "~1", and an empty key gives an empty segment (so {"": 1} is
"/"). Each leaf's value is the RFC 8785 (JCS) canonical JSON text of the leaf, computed
here with the `rfc8785` package, not by hand. An empty arguments object (a tool that takes
none) gives no details at all: the call is still bound by its `upstream` and `tool`.

Each case's `arguments` is written into details.json as the exact JSON text given below,
not re-serialized, so number spellings like 1.50, 1E21 and -0 reach the reader as written.
Python's json module reads that text the way an I-JSON reader would: integers as exact
ints, the rest as IEEE doubles. rfc8785 then serializes them. It rejects integers outside
+/-(2**53 - 1), so the cases stay inside that range; 2**53 appears only in exponent form,
which parses as a double.

In details.json the `details` maps are written with non-ASCII characters escaped
(\\uXXXX), so invisible characters like U+007F and U+2028 stay visible in the file. The
canonical texts are the strings you get after parsing details.json, and they contain those
characters raw, as JCS requires.
"""

from __future__ import annotations

import json
import sys

import rfc8785

# (name, arguments as JSON text). The text is kept verbatim in the output.
CASES: list[tuple[str, str]] = [
    ("flat", '{"amount": 1250, "currency": "EUR", "to": "DE89370400440532013000"}'),
    ("nested objects", '{"payment": {"amount": {"value": 10, "unit": "EUR"}, "memo": "rent"}}'),
    (
        "array of objects",
        '{"items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}], "order_id": "o-42"}',
    ),
    ("array of scalars", '{"tags": ["a", "b", "c"], "matrix": [[1, 2], [3]]}'),
    ("key with slash", '{"a/b": 1, "path": {"/etc/passwd": "r"}}'),
    ("key with tilde", '{"m~n": 1, "~1": "tilde-one, not a slash", "~": true, "/~": null}'),
    ("empty key", '{"": "root-empty", "x": {"": {"": 0}}}'),
    (
        "unicode strings",
        '{"name": "Zo\\u00eb", "emoji": "\\ud83d\\ude00", "cjk": "\u6f22\u5b57", '
        '"escapes": "line\\nquote\\" back\\\\ slash/ tab\\t", "control": "\\u0001\\u001f", '
        '"del_and_ls": "\\u007f\\u2028", "key\\u00e9": "accented key"}',
    ),
    (
        "numbers",
        '{"int": 7, "neg": -3, "zero": 0, "neg_zero": -0, "neg_zero_float": -0.0, '
        '"one_point_five_o": 1.50, "one_point_o": 1.0, "tenth": 0.1, "e21": 1E21, '
        '"e20": 1e20, "tiny": 1e-7, "small": 0.000001, '
        '"max_safe": 9007199254740991, "min_safe": -9007199254740991, '
        '"two_pow_53_as_double": 9.007199254740992e15, "third": 0.3333333333333333, '
        '"max_double": 1.7976931348623157e308, "min_subnormal": 5e-324}',
    ),
    ("booleans and null", '{"yes": true, "no": false, "nothing": null}'),
    ("empty object and array leaves", '{"opts": {}, "list": [], "nested": {"inner": {}, "arr": [[], {}]}}'),
    (
        "deep nesting",
        '{"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": [{"i": [0, {"j": "deep"}]}]}}}}}}}}',
    ),
    (
        "mixed realistic",
        '{"sql": "DELETE FROM users WHERE id = 7", "dry_run": false, "limit": 100, '
        '"params": [7, "x", null, 2.5], "meta": {"requested_by": "agent-1", "labels": {}}}',
    ),
    ("string that looks like json", '{"payload": "{\\"a\\": 1}", "number_text": "1.50"}'),
    ("empty arguments", "{}"),
    ("key order does not matter", '{"z": 1, "a": 2, "m": {"y": 3, "b": 4}}'),
]


def escape_token(key: str) -> str:
    """RFC 6901 reference token: "~" -> "~0" first, then "/" -> "~1"."""
    return key.replace("~", "~0").replace("/", "~1")


def flatten(value: object, pointer: str, out: dict[str, str]) -> None:
    if isinstance(value, dict) and value:
        for key, child in value.items():
            flatten(child, pointer + "/" + escape_token(key), out)
    elif isinstance(value, list) and value:
        for index, child in enumerate(value):
            flatten(child, pointer + "/" + str(index), out)
    else:
        if pointer in out:
            raise SystemExit(f"duplicate pointer {pointer!r}")
        out[pointer] = rfc8785.dumps(value).decode("utf-8")


def no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise SystemExit(f"duplicate key in {keys}")
    return dict(pairs)


def main() -> None:
    names = [name for name, _ in CASES]
    if len(names) != len(set(names)):
        raise SystemExit("duplicate case name")
    entries = []
    for name, text in CASES:
        arguments = json.loads(text, object_pairs_hook=no_duplicate_keys)
        if not isinstance(arguments, dict):
            raise SystemExit(f"{name}: arguments must be a JSON object")
        details: dict[str, str] = {}
        for key, value in arguments.items():
            flatten(value, "/" + escape_token(key), details)
        details = dict(sorted(details.items()))
        entries.append(
            "  {\n"
            f"    \"name\": {json.dumps(name)},\n"
            f"    \"arguments\": {text},\n"
            f"    \"details\": {json.dumps(details, ensure_ascii=True, indent=6)[:-1]}    }}\n"
            "  }"
        )
    output = "[\n" + ",\n".join(entries) + "\n]\n"
    # The output must itself be valid JSON whose arguments round-trip to the same values.
    parsed = json.loads(output)
    for (name, text), case in zip(CASES, parsed):
        if case["name"] != name or case["arguments"] != json.loads(text):
            raise SystemExit(f"{name}: output does not round-trip")
    sys.stdout.write(output)


if __name__ == "__main__":
    main()
