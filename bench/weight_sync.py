"""Weight-sync benchmark: seconds and GB/s to push a policy's state dict into the running CPU vLLM
engine.

Modes (median of --repeats pushes each):
  bucketed          rollout.load_policy_into_vllm (checks names/shapes, one in-place reload,
                    512 MiB buckets)
  per_tensor        the same with bucket_bytes=0: one transfer per tensor (on CPU nothing moves,
                    so this equals "bucketed"; on a cross-GPU push it is one small copy per tensor)
  per_tensor_calls  the naive loop: one engine reload call per tensor. Timing only: it
                    post-processes fused layers (qkv, gate_up) half-loaded, so the bench restores
                    the weights after it.
Models are random tiny Llamas built here (sft.build_tiny_model; ~14M and ~136M parameters, fp32).

    .venv/bin/python bench/weight_sync.py
    .venv/bin/python bench/weight_sync.py --sizes 10m --repeats 5
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import rollout  # noqa: E402,I001  (sets rollout.ENGINE_ENV before anything imports vllm)
import torch  # noqa: E402

from sft import build_tiny_model  # noqa: E402

SIZES = {"10m": dict(hidden_size=512, num_layers=4), "100m": dict(hidden_size=1024, num_layers=10)}

MODES = ("bucketed", "per_tensor", "per_tensor_calls")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--sizes", default="10m,100m", help="comma-separated subset of " + ",".join(SIZES)
)
parser.add_argument(
    "--repeats", type=int, default=3, help="pushes per mode; the median is reported"
)
args = parser.parse_args()


def per_tensor_calls(model, llm):
    t0 = time.perf_counter()
    for name, t in model.state_dict().items():
        llm.collective_rpc(
            "reload_weights",
            kwargs=dict(weights_iterator=iter([(name, t.detach())]), is_checkpoint_format=True),
        )
    llm.reset_prefix_cache()
    return time.perf_counter() - t0


def push(mode, policy, llm):
    """One push of the policy into the engine in `mode` (MODES); returns seconds."""
    if mode == "bucketed":
        return rollout.load_policy_into_vllm(policy, llm)
    if mode == "per_tensor":
        return rollout.load_policy_into_vllm(policy, llm, bucket_bytes=0)
    return per_tensor_calls(policy, llm)


results = []
for size in args.sizes.split(","):
    with tempfile.TemporaryDirectory() as d:
        build_tiny_model(d, **SIZES[size])
        from transformers import AutoModelForCausalLM

        policy = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        n_params = sum(p.numel() for p in policy.parameters())
        # a tied head is counted twice
        n_bytes = sum(t.numel() * t.element_size() for t in policy.state_dict().values())
        llm = rollout.init_vllm(d, device="cpu", seed=0, max_model_len=512)
        row = {
            "size": size,
            "params_m": round(n_params / 1e6, 1),
            "pushed_gb": round(n_bytes / 1e9, 3),
            "tensors": len(policy.state_dict()),
        }
        for mode in MODES:
            with contextlib.redirect_stdout(sys.stderr):  # keep stdout pure JSON
                push(mode, policy, llm)  # warm-up
                times = []
                for _ in range(args.repeats):
                    times.append(push(mode, policy, llm))
                secs = statistics.median(times)
            row[f"{mode}_s"] = round(secs, 4)
            row[f"{mode}_gb_per_s"] = round(n_bytes / 1e9 / secs, 3)
        with contextlib.redirect_stdout(sys.stderr):
            # leave the engine consistent after the naive loop
            rollout.load_policy_into_vllm(policy, llm)
        results.append(row)
        del llm
print(
    json.dumps(
        {
            "bench": "weight_sync",
            "device": "cpu",
            "torch_threads": torch.get_num_threads(),
            "load_avg_1m": round(os.getloadavg()[0], 1),
            "repeats": args.repeats,
            "results": results,
        },
        indent=1,
    )
)
