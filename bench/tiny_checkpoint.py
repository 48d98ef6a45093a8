"""A tiny random-weight Llama checkpoint with SmolLM2's tokenizer: a CPU proxy for a host-bound GPU step.

Its forward costs little, so what a benchmark measures is the serving path around it (as SmolLM2-135M on an H200,
where the step is Python and kernel launches). Tokens are random words; lengths are fixed by min_tokens.

    .venv/bin/python bench/tiny_checkpoint.py /tmp/tiny-llama        # writes the directory, prints its path
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write_tiny_checkpoint(directory: Path, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                          seed: int = 0) -> Path:
    """Save a random Llama (SmolLM2's vocabulary and positions) and SmolLM2's tokenizer into `directory`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trtllm_model.embedded.model_loading import load_tokenizer

    tokenizer = load_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=8192,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    print(write_tiny_checkpoint(args.directory, layers=args.layers, hidden=args.hidden))
    return 0


if __name__ == "__main__":
    sys.exit(main())
