"""The HTTP guard's reading of a request (trtllm_model/launch/http_guard.py), without a server: framing Triton could read
differently is refused, nesting is counted outside strings only. tests/test_e2e_request_size.py runs it in front of
a real tritonserver."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from trtllm_model.launch.http_guard import MAX_BODY_BYTES, Refusal, check_body, nested_deeper_than, parse_head


def head(*lines: str) -> bytes:
    return ("\r\n".join(["POST /v2/models/ensemble/generate HTTP/1.1", "Host: x", *lines]) + "\r\n\r\n").encode()


def refused(data: bytes, body: bytes | None = None) -> Refusal:
    with pytest.raises(Refusal) as caught:
        request = parse_head(data)
        check_body(request, body if body is not None else b"")
    return caught.value


def test_a_plain_request_passes_unchanged():
    data = head("Content-Length: 12", "Content-Type: application/x-www-form-urlencoded")
    request = parse_head(data)
    assert (request.raw, request.content_length, request.expects_continue) == (data, 12, False)


def test_expect_100_continue_is_answered_by_the_guard_and_not_forwarded():
    request = parse_head(head("Expect: 100-continue", "Content-Length: 3"))
    assert request.expects_continue and b"expect" not in request.raw.lower()
    assert request.raw.endswith(b"Content-Length: 3\r\n\r\n")


@pytest.mark.parametrize("lines, status", [
    (("Content-Length: 2097153",), 413),
    (("Transfer-Encoding: chunked",), 411),
    (("Content-Length : 5",), 400),  # a space before the colon
    (("X-A: b\nContent-Length: 5",), 400),  # a bare LF inside a line
    (("X-A: b\rContent-Length: 5",), 400),
    (("Content-Length: 5", "Content-Length: 5"), 400),
    (("Content-Length: +5",), 400),
    (("Content-Length: ５",), 400),  # a digit Python reads, Triton would not
    ((" folded: value",), 400),
    (("Content-Encoding: br",), 415),
])
def test_framing_triton_could_read_differently_is_refused(lines, status):
    assert refused(head(*lines)).status == status


def test_a_malformed_request_line_is_refused():
    assert refused(b"POST  /x HTTP/1.1\r\n\r\n").status == 400
    assert refused(b"POST /x y HTTP/1.1\r\n\r\n").status == 400


def test_nesting_counts_brackets_outside_strings_only():
    assert not nested_deeper_than(b'{"a": "' + b"[" * 1000 + b'"}', 64)
    assert not nested_deeper_than(b'{"a": "\\"' + b"[" * 1000 + b'"}', 64)  # an escaped quote keeps the string open
    assert nested_deeper_than(b"[" * 65, 64) and not nested_deeper_than(b"[" * 64, 64)
    assert nested_deeper_than(b'{"a": "x"' + b"[" * 100, 64)
    assert nested_deeper_than(b'"\\' + b"x" * 10 + b'" ' + b"{" * 100, 64)  # closed string, then the brackets
    assert not nested_deeper_than(b'[1, [2], [3], {"a": [4]}]' * 100, 64)  # many brackets, shallow


def test_an_unclosed_string_is_read_in_one_pass():
    """Quotes that never close (each an escaped one) once made the string pattern retry from every quote."""
    assert not nested_deeper_than(b'"' + b'\\"' * 1_000_000 + b"[" * 100, 64)  # all inside one unclosed string


def test_the_json_part_of_a_binary_body_is_what_is_checked():
    binary = bytes(range(256)) * 2000  # brackets and quotes among the tensor bytes
    json_part = b'{"inputs": []}'
    request = parse_head(head(f"Content-Length: {len(json_part) + len(binary)}",
                              f"Inference-Header-Content-Length: {len(json_part)}"))
    check_body(request, json_part + b"[" * 100 + binary)  # beyond the JSON part: not Triton's JSON
    with pytest.raises(Refusal):
        check_body(parse_head(head("Content-Length: 100")), b"[" * 100)


def test_compressed_bodies_are_checked_decompressed():
    request = parse_head(head("Content-Encoding: gzip", "Content-Length: 1"))
    check_body(request, gzip.compress(b'{"inputs": []}'))
    assert refused(head("Content-Encoding: gzip"), gzip.compress(b"[" * 1000)).status == 400
    assert refused(head("Content-Encoding: gzip"), gzip.compress(b" " * (MAX_BODY_BYTES + 1))).status == 413
    assert refused(head("Content-Encoding: gzip"), b"not gzip").status == 400


def rapidjson_depth(data: bytes) -> int:
    """The deepest nesting a recursive parser reaches on `data`, stopping where a backslash outside a string makes
    it invalid (a plain reading; other syntax errors only make the guard's count an upper bound)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        char = chr(byte)
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "\\":
            break
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def test_nesting_agrees_with_a_plain_parser_and_never_counts_less():
    rng = random.Random(5)
    for _ in range(3000):
        data = bytes(rng.choice(b'[]{}"\\ a') for _ in range(rng.randint(0, 40)))
        for limit in (0, 1, 2, 3):
            if rapidjson_depth(data) > limit:
                assert nested_deeper_than(data, limit), data


def random_value(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.3:
        return "".join(rng.choice('[]{}"\\ a\n') for _ in range(rng.randint(0, 6)))
    if rng.random() < 0.5:
        return [random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": random_value(rng, depth - 1) for i in range(rng.randint(0, 3))}


def test_nesting_of_valid_json_is_exact():
    rng = random.Random(6)
    for _ in range(2000):
        data = json.dumps(random_value(rng, rng.randint(0, 8))).encode()
        for limit in range(0, 9):
            assert nested_deeper_than(data, limit) == (rapidjson_depth(data) > limit), data
