"""Reads a /metrics scrape with the Prometheus client library's own text parser and
prints what it found as JSON, for crates/countersign/tests/it/metrics.rs to check.

    metrics_check.py SCRAPE [DASHBOARD]

Prints {"families": {name: type}, "samples": [[name, labels, value], ...],
"dashboard": {"queried": [...], "missing": [...]}}: with a Grafana dashboard, every
metric name its panels query, and those the scrape lacks. A scrape the parser refuses
exits non-zero with the parser's error.
"""

import json
import math
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

# The suffixes a family's samples add to its name.
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def main():
    text = open(sys.argv[1], encoding="utf-8").read()
    families = {}
    samples = []
    for family in text_string_to_metric_families(text):
        families[family.name] = family.type
        for s in family.samples:
            value = None if math.isnan(s.value) else s.value
            samples.append([s.name, s.labels, value])
    out = {"families": families, "samples": samples}
    if len(sys.argv) > 2:
        out["dashboard"] = dashboard(json.load(open(sys.argv[2], encoding="utf-8")), samples)
    json.dump(out, sys.stdout)


def panels(node):
    for panel in node.get("panels", []):
        yield panel
        yield from panels(panel)


def dashboard(board, samples):
    names = {s[0] for s in samples}
    queried = set()
    for panel in panels(board):
        for target in panel.get("targets", []):
            queried.update(re.findall(r"\bcountersign_[a-z0-9_]+", target.get("expr", "")))
    missing = sorted(n for n in queried if n not in names)
    return {"queried": sorted(queried), "missing": missing, "panels": len(list(panels(board)))}


if __name__ == "__main__":
    main()
