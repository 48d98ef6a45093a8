"""A small parser for the Prometheus text exposition format (what Triton serves on /metrics)."""

from __future__ import annotations

import math
import re
import urllib.request
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,)?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass
class Scrape:
    samples: dict[tuple[str, frozenset], float] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        """The one sample of `name` whose labels include `labels` (asserts there is exactly one)."""
        found = self.find(name, **labels)
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples: {found}"
        return next(iter(found.values()))

    def find(self, name: str, **labels: str) -> dict[frozenset, float]:
        wanted = set(labels.items())
        return {key: v for (n, key), v in self.samples.items() if n == name and wanted <= key}

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(key)[label] for (n, key) in self.samples if n == name and label in dict(key)}


def parse(text: str) -> Scrape:
    scrape = Scrape()
    for line_number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                scrape.types[parts[2]] = parts[3]
            continue
        name, labels, value = _sample(line, line_number)
        key = (name, frozenset(labels.items()))
        assert key not in scrape.samples, f"line {line_number}: duplicate sample {line!r}"
        scrape.samples[key] = value
    return scrape


def _sample(line: str, line_number: int) -> tuple[str, dict[str, str], float]:
    match = _NAME.match(line)
    assert match, f"line {line_number}: no metric name in {line!r}"
    name, rest = match.group(), line[match.end():]
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        rest = rest[1:]
        while not rest.lstrip().startswith("}"):
            label = _LABEL.match(rest)
            assert label, f"line {line_number}: bad label in {line!r}"
            labels[label.group(1)] = re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group()], label.group(2))
            rest = rest[label.end():]
            if label.group(3) is None:
                break
        rest = rest.lstrip()
        assert rest.startswith("}"), f"line {line_number}: unclosed labels in {line!r}"
        rest = rest[1:]
    fields = rest.split()
    assert 1 <= len(fields) <= 2, f"line {line_number}: expected a value (and a timestamp) in {line!r}"
    return name, labels, _number(fields[0])


_SPECIAL = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}


def _number(text: str) -> float:
    return _SPECIAL[text] if text in _SPECIAL else float(text)


def scrape(url: str, timeout_s: float = 10.0) -> Scrape:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse(response.read().decode())
