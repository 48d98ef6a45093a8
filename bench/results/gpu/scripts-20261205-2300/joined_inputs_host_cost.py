"""The host's cost of a joined bucket's inputs (`ModelRunner._decode_inputs`): 90 prompts of 85-94 tokens as rows
(8,192 rows), alone and beside 90 decoding rows; median of 30 calls. Runs at 473860a (JoinedBuckets), from the
repository root: `.venv/bin/python bench/results/gpu/scripts-20261205-2300/joined_inputs_host_cost.py`."""

import sys
import time
from types import SimpleNamespace

sys.path.insert(0, "tests")
from test_fused_forward import tiny_llama  # noqa: E402

from trtllm_model.embedded.runner import JoinedBuckets, ModelRunner  # noqa: E402

runner = ModelRunner(tiny_llama(2))
runner.allocate_kv_pool(20000, 16)
runner.static_shapes, runner.max_graph_rows = True, 8192
runner.joined = JoinedBuckets(512, 32, 256)
prompts, decoding, next_block = [], [], 1
for i in range(90):
    length = 85 + i % 10
    blocks = list(range(next_block, next_block + (length + 15) // 16))
    next_block += len(blocks)
    prompts.append(SimpleNamespace(blocks=SimpleNamespace(block_ids=blocks), token_ids=list(range(100, 100 + length)),
                                   num_computed=0, prefill_end=length, pending=0))
for i in range(90):
    blocks = list(range(next_block, next_block + 7))
    next_block += 7
    decoding.append(SimpleNamespace(blocks=SimpleNamespace(block_ids=blocks), token_ids=list(range(100, 200)),
                                    pending=0, device_row=i))
for label, rows in (("prompts only", []), ("90 decoding + prompts", decoding)):
    times = []
    for _ in range(30):
        started = time.perf_counter()
        inputs, _, _ = runner._decode_inputs(rows, prompts)
        times.append(time.perf_counter() - started)
    times.sort()
    print(f"{label}: rows {inputs.input_ids.shape[0]}, median {times[15] * 1000:.3f} ms, min {times[0] * 1000:.3f} ms")
