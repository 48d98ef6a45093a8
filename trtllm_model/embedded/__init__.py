"""The embedded engine behind the `transformers` executor: in-flight batching over a transformers model's forward.

One file, one job: `model_loading` (weights and tokenizer), `kv_budget` (the pool's size from the memory budget),
`block_manager` (which KV blocks each sequence holds, shared prefixes, eviction), `kv_cache` (the block pool's
tensors and the per-step view the model's forward reads), `runner` (a step's inputs and forwards), `decode_graphs`
(the decode steps' CUDA graphs), `sequence` (one request's state), `sampling` (logits -> tokens), `guided` (grammar
token masks), `scheduler` (who runs this step), `engine` (the loop on its own thread), `cpu_share` (torch threads
that follow the free cores), `invariant_attention` (a token's numbers the same whatever shares its forward).
"""
