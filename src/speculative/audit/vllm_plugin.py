"""A vLLM plugin that corrects how vLLM 0.32's CPU build expands per-request settings to drafted positions.

Explained in: notebooks/13_audit_serving; upstream: vLLM issue #55005
(open), the same fault as the closed PR #42638.

Under speculative decoding, vLLM's rejection sampler copies each request's temperature, top-k and top-p to
its drafted positions (``expand_batch_to_tokens`` in ``vllm/v1/sample/rejection_sampler.py``). Where Triton
has no CPU backend, the copy is done by ``_expand_kernel_impl`` in ``vllm/utils/cpu_triton_utils.py``. It
converts the output buffer to int64 for its C++ op: a float32 (temperature, top-p) or int32 (top-k) buffer
is copied, the op writes the copy, and the buffer the sampler reads is never written. Verification then
reads uninitialised memory as its settings, and the emitted law is not the target's.

A second fault, on every platform whose top-k runs in torch: with top-k and no top-p, a step in which no
request has a drafted position hands ``apply_top_k_only`` (``vllm/v1/sample/ops/topk_topp_sampler.py``)
an empty batch, and ``k.max()`` of an empty tensor raises, which stops the engine.

:func:`register` replaces that function, before the CPU platform registers it, by a torch version that
writes the caller's buffer in its own dtype. vLLM loads it from this package's entry point
(``vllm.general_plugins``: ``speculative_cpu_expand``) in every process it starts. To run vLLM as shipped
with this package installed, set ``VLLM_PLUGINS`` to a list that leaves it out (``VLLM_PLUGINS=``).
"""

from __future__ import annotations

import torch

#: The plugin's name, as ``VLLM_PLUGINS`` lists it.
NAME = "speculative_cpu_expand"


def expand_kernel(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                  replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803 - the kernel's name
    """Write ``input_val[r]`` (``replace_from`` turned into ``replace_to``) at every position of request r,
    positions ``cu_num_tokens[r - 1] .. cu_num_tokens[r] - 1``, into ``output`` itself."""
    ends = cu_num_tokens.to(torch.long)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    total = int(ends[-1]) if len(ends) else 0
    output[:total] = values.repeat_interleave(counts).to(output.dtype)


def _guard_empty(apply_top_k_only):
    """``apply_top_k_only`` that returns an empty batch as it is (vLLM's reduces it with ``k.max()``)."""

    def top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if logits.shape[0] == 0:
            return logits
        return apply_top_k_only(logits, k)

    top_k_only.corrected = True
    return top_k_only


def register() -> None:
    """vLLM's entry point: put :func:`expand_kernel` where the CPU platform looks for its expand kernel,
    and let top-k alone pass a step with no drafted position (:func:`_guard_empty`)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample.ops import topk_topp_sampler

    cpu_triton_utils._expand_kernel_impl = expand_kernel
    if not getattr(topk_topp_sampler.apply_top_k_only, "corrected", False):
        topk_topp_sampler.apply_top_k_only = _guard_empty(topk_topp_sampler.apply_top_k_only)


#: The reproduction an upstream report carries: three requests with 2, 3 and 1 drafted positions.
REPRODUCTION = '''import torch
from vllm.platforms import current_platform
from vllm.utils.cpu_triton_utils import _expand_kernel_impl

current_platform.import_kernels()  # the C++ ops this CPU supports
temperature = torch.tensor([0.5, 2.0, 0.7])  # one value per request
cu_num_draft_tokens = torch.tensor([2, 5, 6], dtype=torch.int32)  # 2, 3 and 1 drafted positions
expanded = torch.full((6,), -7.0)  # vLLM allocates this with new_empty; -7 makes it visible
_expand_kernel_impl(expanded, temperature, cu_num_draft_tokens, -1, 1)
print(expanded.tolist())  # expected [0.5, 0.5, 2.0, 2.0, 2.0, 0.7]
'''


def reproduce() -> dict:
    """Run :data:`REPRODUCTION`'s call with vLLM's shipped function and with :func:`expand_kernel`;
    return what each wrote and what was expected."""
    from vllm.platforms import current_platform
    from vllm.utils import cpu_triton_utils

    current_platform.import_kernels()
    shipped = getattr(cpu_triton_utils._expand_kernel_impl, "__wrapped__", cpu_triton_utils._expand_kernel_impl)
    temperature = torch.tensor([0.5, 2.0, 0.7])
    cu_num_draft_tokens = torch.tensor([2, 5, 6], dtype=torch.int32)
    out = {"expected": [0.5, 0.5, 2.0, 2.0, 2.0, 0.7], "code": REPRODUCTION}
    for label, function in (("shipped", shipped), ("corrected", expand_kernel)):
        expanded = torch.full((6,), -7.0)
        function(expanded, temperature, cu_num_draft_tokens, -1, 1)
        out[label] = [round(v, 6) for v in expanded.tolist()]
    out["shipped_is"] = f"{shipped.__module__}.{shipped.__qualname__}"
    return out


def main(argv=None) -> int:
    """``python -m speculative.audit.vllm_plugin [--record FILE]``: print the reproduction's result (and add it
    to a serving record as its ``reproduction``)."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--record", default=None)
    args = parser.parse_args(argv)
    result = reproduce()
    print("expected ", result["expected"])
    print("shipped  ", result["shipped"], f"({result['shipped_is']})")
    print("corrected", result["corrected"])
    if args.record:
        path = Path(args.record)
        record = json.loads(path.read_text()) if path.exists() else {"schema": "serving-audit/1", "runs": {}}
        record["reproduction"] = result
        path.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
