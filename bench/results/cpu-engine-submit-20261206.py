"""What an `enqueue` to the engine's worker process costs the calling thread (as `execute()` calls it, once per
request): 200 small requests (cancelled again right away), alone and beside 4 threads busy in Python that release
the interpreter's lock now and then, as the stub's delivery workers do. Microseconds per enqueue, wall / this thread's
CPU. From the repository root:

    .venv/bin/python bench/results/cpu-engine-submit-20261206.py
"""

import sys
import threading
import time

sys.path[:0] = ["tests", "."]
from test_engine_process import new_process_executor  # noqa: E402

from trtllm_model.executor_interface import GenerationRequest  # noqa: E402


def busy(stop: threading.Event) -> None:
    while not stop.is_set():
        total = 0
        for i in range(2000):
            total += i
        time.sleep(0)


def per_enqueue_us(executor, count: int = 200) -> str:
    ids, wall, cpu = [], time.perf_counter(), time.thread_time()
    for i in range(count):
        ids.append(executor.enqueue(GenerationRequest(input_ids=[1, 2, 3 + i % 50], max_tokens=2)))
    wall, cpu = (time.perf_counter() - wall) / count * 1e6, (time.thread_time() - cpu) / count * 1e6
    for request_id in ids:
        executor.cancel(request_id)
    done, deadline = set(), time.monotonic() + 60
    while len(done) < count and time.monotonic() < deadline:
        done.update(step.request_id for step in executor.await_steps(0.5) if step.is_final)
    return f"{wall:.0f} / {cpu:.0f}"


def main() -> None:
    executor = new_process_executor(max_batch_size="256")
    try:
        per_enqueue_us(executor)  # warm
        for label, threads in (("alone", 0), ("beside 4 busy threads", 4)):
            stop = threading.Event()
            workers = [threading.Thread(target=busy, args=(stop,), daemon=True) for _ in range(threads)]
            for worker in workers:
                worker.start()
            print(f"{label}: " + ", ".join(per_enqueue_us(executor) for _ in range(3)) + " us", flush=True)
            stop.set()
            for worker in workers:
                worker.join()
    finally:
        executor.shutdown()


if __name__ == "__main__":
    main()
