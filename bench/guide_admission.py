"""What a slow guide costs the requests behind it with the engine in its worker process (engine_process=true): a
guided request whose JSON schema compiles slowly is enqueued, then (once its enqueue has returned) an unguided
one; prints the unguided request's time to its final step (and that of the same request alone, before) and the
guided one's time to its first step (or refusal).

Run: `.venv/bin/python bench/guide_admission.py` (about a minute; `--max-length` sets the schema's string bound,
the larger the slower it compiles; `--timeout-s` is guide_compile_timeout_s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_model.executor_interface import GenerationRequest  # noqa: E402
from trtllm_model.executors.transformers_executor import PARAMETERS, create  # noqa: E402
from trtllm_model.params import Params  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-length", type=int, default=300)
    parser.add_argument("--timeout-s", default="60")
    args = parser.parse_args()
    executor = create(Params({"engine_process": "true", "max_batch_size": "4", "max_num_tokens": "256",
                              "guide_compile_timeout_s": args.timeout_s}, PARAMETERS))
    try:
        warm = executor.enqueue(GenerationRequest([1, 504, 3575], 2, guided_decoding_type="regex",
                                                  guided_decoding_guide="[0-9]+"))
        while not any(step.is_final and step.request_id == warm for step in executor.await_steps(1.0)):
            pass
        alone = time.monotonic()
        request_id = executor.enqueue(GenerationRequest([1, 504, 3577], 2))
        while not any(step.is_final and step.request_id == request_id for step in executor.await_steps(1.0)):
            pass
        alone = time.monotonic() - alone
        schema = json.dumps({"type": "object", "properties": {"note": {"type": "string", "maxLength": args.max_length}},
                             "required": ["note"]})
        started = time.monotonic()
        guided = executor.enqueue(GenerationRequest([1, 2, 3], 4, guided_decoding_type="json_schema",
                                                    guided_decoding_guide=schema))
        handed_on = time.monotonic()
        unguided = executor.enqueue(GenerationRequest([1, 504, 3576], 2))
        seen: dict[int, float] = {}
        refused = None
        while guided not in seen or unguided not in seen:
            for step in executor.await_steps(1.0):
                if step.request_id == guided and guided not in seen:
                    seen[guided] = time.monotonic()
                    refused = step.error
                if step.request_id == unguided and step.is_final:
                    seen[unguided] = time.monotonic()
    except Exception as exc:  # the former stub refused a slow guide at enqueue
        print(f"refused at enqueue after {time.monotonic() - started:.2f} s: {exc}")
        raise
    finally:
        executor.shutdown()
    print(f"guided enqueue returned after {handed_on - started:.2f} s; its first step (or refusal) after "
          f"{seen[guided] - started:.2f} s{' (refused: ' + refused + ')' if refused else ''}")
    print(f"unguided request enqueued after it: final after {(seen[unguided] - handed_on) * 1000:.0f} ms "
          f"(the same request alone before: {alone * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
