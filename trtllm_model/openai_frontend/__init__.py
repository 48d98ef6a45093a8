"""An OpenAI-compatible HTTP API in its own process, in front of tritonserver (gRPC streaming).

Triton keeps its metrics, readiness, model control and our executor exactly as they are; this process only
translates. The flow of one request:

    HTTP (FastAPI + uvicorn)                                     app.py
      -> validate the body (OpenAI's names, 400 naming the field) protocol.py
      -> the model's tokenizer renders the chat template         tokenization.py
      -> token ids to Triton's `tensorrt_llm` over a gRPC stream  triton_pool.py
         (n choices: n requests of the prompt, the first alone)
      <- new token ids per response: detokenized, cut at stop    text_stream.py
    <- SSE chunks (or one JSON body), usage counted in tokens    generation.py

The frontend sends token ids and reads token ids, so the chat template of a whole conversation, the usage counts
and the stop strings are all the tokenizer's, exactly; the model needs no new input for multi-turn chat.
NVIDIA's LLM API model (model_repository_llmapi: text_input, sampling_param_*) is served too: it gets the rendered
prompt as text and answers text (the text so far, when it streams); its tokenizer, named in its model.yaml, counts.
"""
