"""README.md's requests, run as written against the server of the `make serve` line above them.

Every bash block's `curl` and every python block that talks to `localhost` runs in README order; the only change
is the ports (8000, 8001, 9000 become the test server's free ones). A block runs against the server its own `make
serve ...` line starts (as the Makefile turns it into `trtllm-triton serve`), else against plain `make serve`. A
`# {...}` line under a curl is its expected answer."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import Server
from openai_server import start_openai_server

from trtllm_model.launch.cli import LLMAPI_REPOSITORY
from trtllm_model.server import DEFAULT_REPOSITORY

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(bash|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# The Makefile's `serve` rule: LAYOUT, DECOUPLED and ARGS become these `trtllm-triton serve` flags.
MAKE_VARIABLES = {"LAYOUT": "--layout", "DECOUPLED": "--decoupled"}


@dataclass
class Request:
    kind: str  # "curl" or "python"
    text: str
    expected: str | None = None  # a curl's answer, as the README shows it


@dataclass
class Block:
    serve: tuple[str, ...]  # `trtllm-triton serve` flags of the `make serve` line it runs after
    requests: list[Request] = field(default_factory=list)


def serve_flags(make_line: str) -> tuple[str, ...]:
    """`make serve LAYOUT=llmapi ARGS="..."` -> the flags the Makefile passes to `trtllm-triton serve`."""
    flags: list[str] = []
    for word in shlex.split(make_line.split("#")[0])[2:]:
        name, _, value = word.partition("=")
        flags += [MAKE_VARIABLES[name], value] if name in MAKE_VARIABLES else shlex.split(value)
    return tuple(flags)


def readme_blocks(text: str) -> list[Block]:
    """The README's code blocks that send requests, in order."""
    blocks = []
    for language, body in FENCE.findall(text):
        if language == "python":
            if "localhost:" in body:
                blocks.append(Block((), [Request("python", body)]))
            continue
        block = Block(())
        lines = body.replace("\\\n", " ").splitlines()
        for line in lines:
            if line.startswith("make serve"):
                block.serve = serve_flags(line)
            elif line.startswith("curl "):
                block.requests.append(Request("curl", line))
            elif line.startswith("# ") and block.requests and block.requests[-1].expected is None:
                block.requests[-1].expected = line[2:]
        if block.requests:
            blocks.append(block)
    return blocks


def test_the_readme_is_parsed_into_its_requests():
    blocks = readme_blocks(README.read_text())
    assert blocks[0].serve == () and blocks[0].requests[0].expected
    assert any(block.serve == ("--layout", "llmapi") for block in blocks)
    kinds = {request.kind for block in blocks for request in block.requests}
    assert kinds == {"curl", "python"} and sum(len(block.requests) for block in blocks) >= 6
    assert serve_flags('make serve DECOUPLED=false ARGS="--model /x --set a=1"') == (
        "--decoupled", "false", "--model", "/x", "--set", "a=1")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Servers by their `serve` flags, each started on first use (the README's order) and stopped at the end."""
    running: dict[tuple[str, ...], tuple[Server, int]] = {}

    def server_for(flags: tuple[str, ...]) -> tuple[Server, int]:
        if flags not in running:
            for other, (server, _) in list(running.items()):  # one at a time, as one terminal runs them
                server.stop()
                del running[other]
            workdir = tmp_path_factory.mktemp("readme")
            repository = LLMAPI_REPOSITORY if "llmapi" in flags else DEFAULT_REPOSITORY
            server, base_url = start_openai_server(workdir, None, repository=repository, serve_args=list(flags))
            running[flags] = server, int(base_url.split(":")[-1].split("/")[0])
        return running[flags]

    yield server_for
    for server, _ in running.values():
        server.stop()


def on_test_ports(text: str, server: Server, openai_port: int) -> str:
    return (text.replace("localhost:8000", f"localhost:{server.http_port}")
            .replace("localhost:8001", f"localhost:{server.grpc_port}")
            .replace("localhost:9000", f"localhost:{openai_port}"))


def test_every_readme_request_answers_as_shown(servers):
    for block in readme_blocks(README.read_text()):
        server, openai_port = servers(block.serve)
        for request in block.requests:
            text = on_test_ports(request.text, server, openai_port)
            command = ["bash", "-c", text] if request.kind == "curl" else [sys.executable, "-c", text]
            result = subprocess.run(command, capture_output=True, text=True, timeout=300)
            where = f"make serve {' '.join(block.serve)}: {request.text[:200]}"
            assert result.returncode == 0, f"{where}\n{result.stdout}\n{result.stderr}"
            assert result.stdout.strip() and "error" not in result.stdout.lower(), f"{where}\n{result.stdout}"
            if request.expected is not None:
                assert json.loads(result.stdout) == json.loads(request.expected), where
