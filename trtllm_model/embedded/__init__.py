"""The embedded engine behind the `transformers` executor: in-flight batching over a transformers model's forward.

One file, one job: `model_loading` (weights and tokenizer), `kv_cache` (the running batch's KV cache),
`sequence` (one request's state), `sampling` (logits -> tokens), `scheduler` (who runs this step),
`engine` (the loop on its own thread).
"""
