"""The tokenizer the model uses, loaded in the frontend: prompts become token ids here, outputs text here.

Which tokenizer follows from the model's config.pbtxt parameters (read from Triton) the way the executors choose
theirs: the synthetic executor's byte tokenizer, the embedded SmolLM2's, or `tokenizer_dir` / the checkpoint.
`trtllm-triton serve --executor NAME` overrides the config's executor; the frontend must be told the same name
(`serve` does that itself; `trtllm-triton openai --executor NAME` otherwise).
"""

from __future__ import annotations

from ..executor_interface import Tokenizer
from ..pipeline.detokenizer import chat_prompt_ids as template_prompt_ids

# Tokenizers without a chat template (the synthetic executor's) get this plain rendering.
PLAIN_ROLE_LINE = "{role}: {content}\n"
PLAIN_GENERATION_PROMPT = "assistant:"


def config_parameters(model_config: dict) -> dict[str, str]:
    """config.pbtxt `parameters` as plain strings; unfilled `${...}` template values count as unset."""
    values = {key: entry.get("string_value", "") for key, entry in model_config.get("parameters", {}).items()}
    return {key: value for key, value in values.items() if value and not value.startswith("${")}


def load_model_tokenizer(parameters: dict[str, str], executor: str | None = None) -> Tokenizer | None:
    """The tokenizer the model's executor uses; None when it has none (token-level engines without tokenizer_dir)."""
    name = executor or parameters.get("executor") or "transformers"
    if name == "synthetic":
        from ..executors.synthetic import SyntheticTokenizer

        return SyntheticTokenizer()
    if name == "transformers":
        from ..embedded.model_loading import load_tokenizer

        return load_tokenizer(parameters.get("tokenizer_dir") or parameters.get("model_dir"),
                              parameters.get("model_cache_dir"))
    directory = parameters.get("tokenizer_dir") or parameters.get("hf_model_path")
    if not directory:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def llmapi_tokenizer_parameters(model_repository: str | None, name: str) -> tuple[dict[str, str], str] | None:
    """An LLM API model's tokenizer, from its model.yaml (`model`, `executor`) in the repository's latest version
    directory, as config.pbtxt-style parameters and the executor name; None without a repository or a model.yaml."""
    from pathlib import Path

    from ..model_yaml import embedded_parameters, model_yaml_path, read_model_yaml

    if not model_repository:
        return None
    versions = sorted((p for p in (Path(model_repository) / name).glob("[0-9]*") if p.name.isdigit()),
                      key=lambda p: int(p.name))
    path = model_yaml_path(versions[-1]) if versions else None
    if path is None:
        return None
    config = read_model_yaml(path)
    if config.executor == "transformers":
        return embedded_parameters(config)[0], "transformers"
    return {"tokenizer_dir": str(config.llm_kwargs["model"])}, config.executor


def chat_prompt_ids(tokenizer: Tokenizer, messages: list[dict], tools: list[dict] | None = None,
                    tools_text: str = "") -> list[int]:
    """The conversation through the model's chat template (the same ids as the model's `apply_chat_template`
    input), ready for the assistant's turn, as token ids; a plain rendering without a template.

    `tools` (OpenAI's entries) go to a template that renders them; one that does not (SmolLM2's) gets `tools_text`
    in the system message instead."""
    template = getattr(tokenizer, "chat_template", None)
    if tools and not (isinstance(template, str) and "tools" in template):
        messages = _with_system_text(messages, tools_text)
        tools = None
    if template:
        return template_prompt_ids(tokenizer, messages, tools)
    text = "".join(PLAIN_ROLE_LINE.format(role=m["role"], content=m["content"]) for m in messages)
    text += PLAIN_GENERATION_PROMPT
    return tokenizer.encode(text, add_special_tokens=False)


def _with_system_text(messages: list[dict], text: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{text}" if messages[0]["content"] else text)
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def context_length(tokenizer: Tokenizer) -> int | None:
    """The model's context length: the tokenizer's model_max_length when it is a real limit (transformers uses ~1e30
    for 'unknown'), else the positions in the config.json beside the tokenizer (a Hugging Face checkpoint's)."""
    length = getattr(tokenizer, "model_max_length", None)
    if isinstance(length, int) and 0 < length < 10**7:
        return int(length)
    import json
    from pathlib import Path

    directory = getattr(tokenizer, "name_or_path", None)
    if not directory:
        return None
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    return int(positions) if isinstance(positions, int) and positions > 0 else None
