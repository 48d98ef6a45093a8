"""On CUDA only (skipped elsewhere): two instances of the transformers executor on the same GPU (instance_group
count 2, NVIDIA's gpu_device_ids "0;0") start sharing one engine worker, both serve, and a stop ends every stream of
both with one final response each. The 2-GPU form ("0;1", a worker each) is the same test on a host with two GPUs
(docs/performance.md)."""

from __future__ import annotations

import re
import signal
import time

import pytest
import torch
from conftest import start_server
from test_e2e_multi_instance import INSTANCES, ONE_INSTANCE, TWO_INSTANCES, per_instance
from triton_client import StreamClient, token_inputs, wait_until_streaming

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

STREAMS = 16


def test_two_instances_on_one_gpu_both_serve_and_a_stop_ends_every_stream(tmp_path):
    server = start_server(tmp_path, executor="transformers", new_session=True, parameters={"gpu_device_ids": "0;0"},
                          config_edits={ONE_INSTANCE: TWO_INSTANCES})
    client = StreamClient(server.grpc_url)
    try:
        attached = re.findall(r"stub (\d) \(pid \d+\) attached; (\d) of 2", server.log())
        assert sorted(attached) == [("1", "1"), ("2", "2")], server.log()[-3000:]  # one worker for both
        streams = [client.send("tensorrt_llm", token_inputs([1, 2, 3 + i], 4000), f"t-{i}")
                   for i in range(STREAMS)]
        deadline = time.monotonic() + 120
        while not all(per_instance(server, "nv_llm_open_requests").get(name, 0) > 0 for name in INSTANCES):
            assert time.monotonic() < deadline, (per_instance(server, "nv_llm_open_requests"), server.log()[-3000:])
            time.sleep(0.2)
        wait_until_streaming(streams, max(0.0, deadline - time.monotonic()))
        server.process.send_signal(signal.SIGTERM)
        for stream in streams:
            assert stream.done.wait(20), f"a stream got no final response:\n{server.log()[-3000:]}"
        for stream in streams:
            assert stream.finals == 1, (stream.finals, stream.errors)
            # One that reached its end token first has its own final; every other one ends UNAVAILABLE.
            assert all(error.startswith("UNAVAILABLE: ") for error in stream.errors), stream.errors
        assert sum(len(s.errors) for s in streams) > STREAMS // 2
        client.close()
        assert server.process.wait(30) == 0, server.log()[-3000:]
    finally:
        server.stop()
