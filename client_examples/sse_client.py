"""Stream an answer over HTTP Server-Sent Events from /v2/models/ensemble/generate_stream (standard library only).

    python3 client_examples/sse_client.py "What is the capital of France?"
    python3 client_examples/sse_client.py --no-chat-template --max-tokens 20 "Once upon a time"

Triton's generate extension takes the inputs as JSON keys and answers one `data: {...}` line per response;
the new text of each is in `text_output`, and an error arrives as `data: {"error": "..."}`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request


def generate_stream(url: str, model: str, body: dict, timeout_s: float):
    """Yield each event's JSON object as the server sends it."""
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v2/models/{model}/generate_stream",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        for raw in response:  # the body arrives line by line as the server flushes each event
            line = raw.decode("utf-8").rstrip("\r\n")
            if line.startswith("data:"):
                yield json.loads(line[len("data:") :].strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt")
    parser.add_argument("--url", default="http://localhost:8000")
    parser.add_argument("--model", default="ensemble")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wrap the prompt in the model's chat template on the server (default: on)",
    )
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds without data before giving up")
    args = parser.parse_args()

    body = {
        "text_input": args.prompt,
        "max_tokens": args.max_tokens,
        "stream": True,
        "apply_chat_template": args.chat_template,
        "return_finish_reason": True,
    }
    if args.temperature is not None:
        body["temperature"] = args.temperature
    if args.seed is not None:
        body["seed"] = args.seed

    started = time.monotonic()
    events, finish_reason = 0, None
    try:
        for event in generate_stream(args.url, args.model, body, args.timeout):
            if "error" in event:
                print(f"\n[server error] {event['error']}", file=sys.stderr)
                return 1
            events += 1
            print(event.get("text_output", ""), end="", flush=True)
            finish_reason = event.get("finish_reason", finish_reason)
    except urllib.error.HTTPError as exc:  # a request refused before streaming started
        print(f"[HTTP {exc.code}] {exc.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, TimeoutError) as exc:
        print(f"[cannot reach {args.url}] {exc}", file=sys.stderr)
        return 1
    print(f"\n[{events} events in {time.monotonic() - started:.2f} s, finish reason: {finish_reason}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
