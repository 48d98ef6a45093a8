"""The poller alone, no Triton: how many responses a second its Python work allows, and CPU per response.

    .venv/bin/python bench/poller_alone.py [--streams 256] [--send-ms 0] [--seconds 5]
    (cd <older worktree> && /work/main/.venv/bin/python /work/main/bench/poller_alone.py --code .)   # an older tree

`--streams` requests over a SyntheticExecutor at 10 ms steps (streams x 100 tokens/s offered); every response goes
through one shared "channel" (a lock, as the stub has one IPC channel) that holds it `--send-ms` (0: the send only
counts, so the figure is the Python cost of a response: receive, route, build, queue). Timers follow
TRTLLM_DELIVERY_TIMING_S as in the server.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--send-ms", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--sender-threads", type=int, default=4)
    parser.add_argument("--code", default=None, help="import trtllm_model from this checkout")
    args = parser.parse_args()
    if args.code:
        sys.path.insert(0, os.path.abspath(args.code))
    from trtllm_model.conventions.common import ParsedRequest
    from trtllm_model.executor_interface import GenerationRequest
    from trtllm_model.executors.synthetic import SyntheticExecutor
    from trtllm_model.serving.poller import Poller
    from trtllm_model.serving.request_context import RequestContext

    channel, sent, send_s = threading.Lock(), [0], args.send_ms / 1000.0

    class CountingStream:
        def send(self, outputs, final):
            with channel:
                if send_s:
                    time.sleep(send_s)
                sent[0] += 1

        def send_error(self, code, message):
            pass

        def is_cancelled(self):
            return False

    poller = Poller(SyntheticExecutor(step_ms=10, max_batch_size=args.streams + 1), sender_threads=args.sender_threads)
    poller.start()
    for i in range(args.streams):
        request = GenerationRequest(input_ids=[i], max_tokens=1_000_000, streaming=True, exclude_input_in_output=True)
        poller.submit(RequestContext(ParsedRequest(request, text_mode=False, prompt_ids=[i]), CountingStream()))
    time.sleep(2)  # warm-up
    count0, t0, usage0 = sent[0], time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(args.seconds)
    count1, t1, usage1 = sent[0], time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    poller.shutdown(timeout_s=2)
    cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    responses = count1 - count0
    import trtllm_model

    print(f"{os.path.dirname(os.path.dirname(trtllm_model.__file__))}: {responses / (t1 - t0):.0f} responses/s, "
          f"{args.streams * 100 / max(responses / (t1 - t0), 1):.2f} tokens/response, "
          f"{cpu / max(responses, 1) * 1e6:.1f} us CPU per response, {cpu / (t1 - t0):.2f} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
