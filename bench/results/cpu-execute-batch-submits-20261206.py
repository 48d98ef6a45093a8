"""What a batch of 64 enqueues to the engine's worker process costs the calling thread (as one `execute()` call of 64
requests makes them): each sent at once, against held and sent as one message (`enqueue_together`), alone and beside
4 threads busy in Python that let go of the interpreter's lock now and then, as the stub's delivery workers do.
Milliseconds per batch, wall / this thread's CPU, median of 15 batches a measurement. From the repository root:

    .venv/bin/python bench/results/cpu-execute-batch-submits-20261206.py
"""

import statistics
import sys
import threading
import time
from contextlib import nullcontext

sys.path[:0] = ["tests", "."]
from test_engine_process import new_process_executor  # noqa: E402

from trtllm_model.executor_interface import GenerationRequest  # noqa: E402

BATCH = 64


def busy(stop: threading.Event) -> None:
    while not stop.is_set():
        total = 0
        for i in range(2000):
            total += i
        time.sleep(0)


def batch_ms(executor, together: bool) -> tuple[float, float]:
    ids, wall, cpu = [], time.perf_counter(), time.thread_time()
    with executor.enqueue_together() if together else nullcontext():
        for i in range(BATCH):
            ids.append(executor.enqueue(GenerationRequest(input_ids=[1, 2, 3 + i % 50], max_tokens=2)))
    wall, cpu = (time.perf_counter() - wall) * 1e3, (time.thread_time() - cpu) * 1e3
    for request_id in ids:
        executor.cancel(request_id)
    done, deadline = set(), time.monotonic() + 60
    while len(done) < BATCH and time.monotonic() < deadline:
        done.update(step.request_id for step in executor.await_steps(0.5) if step.is_final)
    return wall, cpu


def measurement(executor, together: bool) -> str:
    runs = [batch_ms(executor, together) for _ in range(15)]
    return f"{statistics.median(w for w, _ in runs):.2f} / {statistics.median(c for _, c in runs):.2f}"


def main() -> None:
    executor = new_process_executor(max_batch_size="256")
    try:
        batch_ms(executor, False)  # warm
        for label, threads in (("alone", 0), ("beside 4 busy threads", 4)):
            stop = threading.Event()
            workers = [threading.Thread(target=busy, args=(stop,), daemon=True) for _ in range(threads)]
            for worker in workers:
                worker.start()
            for _ in range(3):
                print(f"{label}: each at once {measurement(executor, False)} ms, "
                      f"as one message {measurement(executor, True)} ms", flush=True)
            stop.set()
            for worker in workers:
                worker.join()
    finally:
        executor.shutdown()


if __name__ == "__main__":
    main()
