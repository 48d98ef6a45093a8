import time
from types import SimpleNamespace as NS
import sys
sys.path.insert(0, "tests")
import torch
from test_fused_forward import tiny_llama
from trtllm_model.embedded.runner import ModelRunner, JoinedBuckets

runner = ModelRunner(tiny_llama(2))
runner.allocate_kv_pool(20000, 16)
runner.static_shapes, runner.max_graph_rows = True, 8192
runner.joined = JoinedBuckets(512, 32, 256)
prompts = []
b = 1
for i in range(90):
    n = 85 + i % 10
    blocks = list(range(b, b + (n + 15) // 16)); b += len(blocks)
    prompts.append(NS(blocks=NS(block_ids=blocks), token_ids=list(range(100, 100 + n)), num_computed=0, prefill_end=n, pending=0))
decoding = []
for i in range(90):
    blocks = list(range(b, b + 7)); b += 7
    decoding.append(NS(blocks=NS(block_ids=blocks), token_ids=list(range(100, 200)), pending=0, device_row=i))
for label, dec in (("prompts only", []), ("90 decoding + prompts", decoding)):
    times = []
    for _ in range(30):
        t = time.perf_counter()
        inputs, keep, ends = runner._decode_inputs(dec, prompts)
        times.append(time.perf_counter() - t)
    times.sort()
    print(label, "rows", inputs.input_ids.shape[0], "median ms %.3f" % (times[15] * 1000), "min %.3f" % (times[0] * 1000))
