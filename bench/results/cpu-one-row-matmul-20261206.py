"""Does a CPU matmul round a token's row otherwise when the token goes alone (1 row) than among others? For every
linear of SmolLM2 (30 layers: q, k, v, o, gate, up, down; and the head), the inputs the model really gives for an
81-token prompt (transformers' forward, hooked), each row computed within the whole 81-row matmul, alone (1 row),
and as the last of 2 rows. Prints, per dtype, how many of the 81 rows differ alone and as 2 rows. From the
repository root:

    .venv/bin/python bench/results/cpu-one-row-matmul-20261206.py
"""

import torch
import torch.nn.functional as F

from trtllm_model.embedded.model_loading import load_model

torch.set_num_threads(2)
print(torch.__version__, torch.backends.cpu.get_cpu_capability())
for dtype in ("bfloat16", "float16", "float32"):
    loaded = load_model(dtype=dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    prompt = tokenizer("The capital of France is Paris. " * 12, return_tensors="pt")["input_ids"][:, :81]
    inputs: dict[str, torch.Tensor] = {}
    linears = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    hooks = [module.register_forward_pre_hook(lambda _, args, name=name, seen=inputs: seen.__setitem__(name, args[0][0].clone()))
             for name, module in linears.items()]
    with torch.no_grad():
        model(prompt)
        for hook in hooks:
            hook.remove()
        alone = pair = rows = 0
        for name, x in inputs.items():
            weight = linears[name].weight
            whole = F.linear(x, weight)
            alone += sum(not torch.equal(F.linear(x[i : i + 1], weight)[0], whole[i]) for i in range(len(x)))
            pair += sum(not torch.equal(F.linear(x[i - 1 : i + 1], weight)[1], whole[i]) for i in range(1, len(x)))
            rows += len(x)
    print(f"{dtype}: {len(inputs)} linears, {rows} rows; a row differs from the 81-row matmul's alone in {alone}, "
          f"as the last of 2 rows in {pair}", flush=True)
