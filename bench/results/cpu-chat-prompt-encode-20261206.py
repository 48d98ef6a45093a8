"""A chat prompt's token ids (SmolLM2's template, 200 distinct user questions): the template then transformers'
`encode` (main before trtllm_model/text_encoding.py) against `chat_prompt_ids` (the template then the Rust
tokenizer's `encode`), alone and beside 4 threads busy in Python that release the interpreter's lock now and then,
as the stub's delivery workers do. Microseconds per prompt, wall / this thread's CPU. From the repository root:

    .venv/bin/python bench/results/cpu-chat-prompt-encode-20261206.py
"""

import sys
import threading
import time

sys.path[:0] = ["."]
from trtllm_model.detokenizer import chat_prompt_ids  # noqa: E402
from trtllm_model.embedded.model_loading import load_tokenizer  # noqa: E402

tokenizer = load_tokenizer()
MESSAGES = [[{"role": "user", "content": f"What is the capital of France? (question {i})"}] for i in range(200)]


def through_transformers(messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def per_prompt_us(encode) -> str:
    wall, cpu = time.perf_counter(), time.thread_time()
    for messages in MESSAGES:
        encode(messages)
    n = len(MESSAGES)
    return f"{(time.perf_counter() - wall) / n * 1e6:.0f} / {(time.thread_time() - cpu) / n * 1e6:.0f}"


def busy(stop: threading.Event) -> None:
    while not stop.is_set():
        total = 0
        for i in range(2000):
            total += i
        time.sleep(0)


def main() -> None:
    assert all(through_transformers(m) == chat_prompt_ids(tokenizer, m) for m in MESSAGES)
    for label, threads in (("alone", 0), ("beside 4 busy threads", 4)):
        stop = threading.Event()
        workers = [threading.Thread(target=busy, args=(stop,), daemon=True) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for _ in range(3):
            print(f"{label}: transformers' encode {per_prompt_us(through_transformers)} us, "
                  f"the Rust encode {per_prompt_us(lambda m: chat_prompt_ids(tokenizer, m))} us", flush=True)
        stop.set()
        for worker in workers:
            worker.join()


if __name__ == "__main__":
    main()
