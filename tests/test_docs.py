"""The user docs agree with the files they quote: compose excerpts are docker-compose.yml's text, the compose
services they name exist, sections are numbered once, and no internal tracker notes ("issue 4") are left."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
# What a user reads: the README and docs/ (docs/history/ keeps the record of tries, with its issue numbers).
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
YAML_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.MULTILINE | re.DOTALL)
COMPOSE_COMMAND = re.compile(r"docker-compose(?: --profile \S+)? (?:up|logs)(?: -[a-z])*((?: [a-z][-a-z0-9]*)*)")
SERVICE_PORT = re.compile(r"`([a-z][-a-z0-9]*):800[0-2]`")


def compose_services() -> set[str]:
    return set(yaml.safe_load(COMPOSE.read_text())["services"])


def test_compose_excerpts_in_the_docs_are_the_files_text():
    compose = COMPOSE.read_text()
    quoted = [(doc.name, block) for doc in USER_DOCS for block in YAML_BLOCK.findall(doc.read_text())
              if "trtllm-triton" in block and ("services:" in block or "x-trtllm-triton" in block)]
    assert quoted, "docs/deploy.md quotes docker-compose.yml"
    for name, block in quoted:
        assert block in compose, (f"{name} quotes a docker-compose.yml that is not the file's text; copy the file's "
                                  "lines into it again")


def test_the_compose_services_the_docs_name_exist():
    services = compose_services()
    named = set()
    for doc in USER_DOCS:
        text = doc.read_text()
        for words in COMPOSE_COMMAND.findall(text):
            named.update(words.split())
        named.update(SERVICE_PORT.findall(text))
    assert named and named <= services, f"not in docker-compose.yml: {sorted(named - services)}"


def test_no_internal_tracker_notes_in_user_docs():
    notes = [f"{doc.name}: {line.strip()}" for doc in USER_DOCS for line in doc.read_text().splitlines()
             if re.search(r"\bissues? \d+", line, re.IGNORECASE)]
    assert notes == []


def test_numbered_sections_are_numbered_once_and_in_order():
    for doc in USER_DOCS:
        numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", doc.read_text(), re.MULTILINE)]
        assert numbers == sorted(set(numbers)), f"{doc.name}: sections {numbers}"
