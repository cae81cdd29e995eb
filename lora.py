"""LoRA for every trainer (sft.py, grpo.py, grpo_ray.py, expert_iteration.py), through `peft`.

With --lora-rank r > 0 each targeted nn.Linear W of the loaded model gets a trainable low-rank
update: W x + (alpha / r) B A x, A (r, in) and B (out, r), B = 0 at the start (peft's
inject_adapter_in_model, which keeps the model's own class, so losses.get_response_log_probs'
chunked head and shared-prefix path run unchanged). What the trainers get from here:
- `add_flags` / `check_flags`: the "lora" flag group, checked in one line each;
- `wrap`: the adapters, in fp32 whatever the base's dtype, and (on --resume) their saved weights;
  the base is frozen, so the trainers load it in the compute dtype (no fp32 master copy) and the
  optimizer holds only `trainable(model)`. --pure-bf16 then changes nothing: the base is in the
  compute dtype already, and the adapters and their AdamW state stay fp32 (they are small);
- `merged_state_dict`: the base's names and shapes with W + (alpha / r) B A, what the engine
  receives (rollout.load_policy_into_vllm calls it), so vLLM needs no LoRA support;
- `adapters_off`: the model without its adapters, the KL reference pi_init (no frozen copy);
  `adapter_state` + `loaded`: pi_{t-1} as a copy of the adapters only;
- `save_adapter` / `load_adapter`: a checkpoint's adapter (peft's adapter_model.safetensors and
  adapter_config.json, which peft's PeftModel.from_pretrained also reads); `export_merged`: a
  plain HF model for the evaluation scripts and serving.
Without --lora-rank every function is the identity (or a no-op) and peft is never imported.

Written against peft's documented low-level API rather than by hand: its layer classes handle
fan-in/fan-out conventions and quantized bases, and its adapter files are what other tools read.
"""

import contextlib
import json
import os

import torch

import common

# every attention and MLP projection; peft's "all-linear" is each nn.Linear except the output head
DEFAULT_TARGETS = "all-linear"
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's file names, so PeftModel reads a checkpoint
ADAPTER_CONFIG = "adapter_config.json"
PREFIX = "base_model.model."  # peft's prefix of a saved adapter's tensor names


# ----------------------------------------------------------------------------- flags
def add_flags(parser):
    """The "lora" flag group (the same in every trainer)."""
    g = parser.add_argument_group("lora")  # --- lora ---
    g.add_argument(
        "--lora-rank",
        type=common.nonneg_int,
        default=0,
        help="LoRA rank r of every targeted projection (0 = full fine-tuning)",
    )
    g.add_argument(
        "--lora-alpha",
        type=common.positive_float,
        default=32.0,
        help="LoRA scale alpha: the update is (alpha / r) B A",
    )
    g.add_argument(
        "--lora-dropout",
        type=common.fraction,
        default=0.0,
        help="dropout on the adapters' input (training forwards only)",
    )
    g.add_argument(
        "--lora-targets",
        default=DEFAULT_TARGETS,
        help="comma-separated module names (q_proj,v_proj) or all-linear (every attention and MLP"
        " projection)",
    )
    g.add_argument(
        "--qlora",
        action="store_true",
        help="4-bit base through bitsandbytes (CUDA only; needs --lora-rank)",
    )
    g.add_argument(
        "--export-merged",
        default=None,
        help="at the end, also write the merged model (a plain HF model) to this directory",
    )


def check_flags(args):
    """The lora flags against each other, each a one-line error naming the fix."""
    common.check(
        args.lora_dropout < 1, f"--lora-dropout {args.lora_dropout} must be below 1 (0 = none)"
    )
    common.check(
        not args.qlora or args.lora_rank > 0, "--qlora trains adapters: pass --lora-rank r > 0"
    )
    # a snapshot of a LoRA run would be its adapter, which the evaluators' sweep cannot load
    common.check(
        not (args.lora_rank and args.keep_checkpoints),
        "--keep-checkpoints keeps full models; under --lora-rank use --export-merged (the final "
        "merged model) instead",
    )
    if args.resume:
        check_resume(args)


def check_resume(args):
    """A resumed run trains what its checkpoint holds: a LoRA run with its rank and alpha, a full
    run without LoRA. Each mismatch is one line, before anything loads."""
    saved_lora = is_adapter_dir(args.resume)
    common.check(
        args.lora_rank or not saved_lora,
        f"--resume {args.resume} is a LoRA run: resume it with its --lora-rank",
    )
    common.check(
        not args.lora_rank or saved_lora,
        f"--resume {args.resume} is a full fine-tuning run: drop --lora-rank (or start a LoRA run "
        "from its checkpoint with --model)",
    )
    if not saved_lora:
        return
    with open(os.path.join(args.resume, ADAPTER_CONFIG)) as f:
        saved = json.load(f)
    # alpha scales the whole learned update: another value would silently rescale it
    common.check(
        float(saved["lora_alpha"]) == args.lora_alpha,
        f"--lora-alpha {args.lora_alpha} differs from the run's {saved['lora_alpha']}: resume "
        "with the run's",
    )


def check_device(args, device):
    """QLoRA's 4-bit base is bitsandbytes' CUDA kernels: refused elsewhere, before any load."""
    common.check(
        not args.qlora or str(device).startswith("cuda"),
        f"--qlora needs a CUDA policy device (bitsandbytes' 4-bit kernels), not {device}: "
        "drop --qlora (plain --lora-rank runs on CPU)",
    )
    # never run here (no GPU): refused rather than silently trained as plain LoRA
    common.check(
        not args.qlora,
        "--qlora: the 4-bit base is not implemented yet (untested without a GPU); drop --qlora",
    )


def targets(args):
    """--lora-targets as peft takes it: "all-linear" or a list of module names."""
    if args.lora_targets == "all-linear":
        return "all-linear"
    return [name.strip() for name in args.lora_targets.split(",") if name.strip()]


def model_path(args):
    """Where the trainer loads full weights from: a LoRA checkpoint holds only the adapter, so the
    base is always --model; else the checkpoint on --resume."""
    if args.lora_rank:
        return args.model
    return args.resume or args.model


# ----------------------------------------------------------------------------- the adapters
def wrap(model, args):
    """model with LoRA adapters (fp32) on --lora-targets and its base frozen; on --resume, the
    checkpoint's adapter weights. Without --lora-rank: model unchanged."""
    if not args.lora_rank:
        return model
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=targets(args),
        base_model_name_or_path=args.model,
    )
    try:
        inject_adapter_in_model(config, model)
    except ValueError as e:  # no module of that name: peft's message names the model's modules
        common.fail(f"--lora-targets {args.lora_targets}: {str(e).splitlines()[0][:300]}")
    for p in trainable(model):
        p.data = p.data.float()  # fp32 adapters over a base in the compute dtype
    if getattr(model, "is_gradient_checkpointing", False):
        # reentrant checkpointing passes gradients only to inputs that need them: the frozen
        # embeddings' output must
        model.enable_input_require_grads()
    if args.resume:
        load_adapter(model, args.resume)
    n = sum(p.numel() for p in trainable(model))
    total = sum(p.numel() for p in model.parameters())
    print(
        f"lora: rank {args.lora_rank}, alpha {args.lora_alpha:g}, {len(lora_layers(model))} "
        f"layers, {n / 1e6:.2f}M trainable of {total / 1e6:.1f}M parameters"
    )
    return model


def trainable(model):
    """The parameters the optimizer holds: all of them, or with LoRA only the adapters."""
    return [p for p in model.parameters() if p.requires_grad]


def lora_layers(model):
    """[(name, layer)] of the model's LoRA layers (peft's, which hold lora_A); [] without LoRA."""
    layers = []
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and hasattr(module, "get_delta_weight"):
            layers.append((name, module))
    return layers


def merged_state_dict(model):
    """The model's state dict under its base names, each LoRA layer's weight W + (alpha / r) B A
    (rounded once, to W's dtype): what the engine and a merged save receive. Without LoRA:
    model.state_dict()."""
    layers = lora_layers(model)
    if not layers:
        return model.state_dict()
    deltas = {}
    for name, layer in layers:
        deltas[f"{name}.weight"] = layer.get_delta_weight("default")  # (out, in), fp32
    merged = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        if key in deltas:
            value = (value.float() + deltas[key].to(value.device)).to(value.dtype)
        merged[key] = value
    return merged


@contextlib.contextmanager
def adapters_off(model):
    """The base model inside the block (each LoRA layer's adapter skipped): pi_init, the KL
    reference. A no-op for a model without LoRA."""
    layers = lora_layers(model)
    for _, layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for _, layer in layers:
            layer.enable_adapters(True)


def adapter_state(model):
    """{name: a detached copy} of the adapter weights (pi_{t-1} for --kl-every)."""
    state = {}
    for name, p in model.named_parameters():
        if ".lora_" in name:
            state[name] = p.detach().clone()
    return state


@contextlib.contextmanager
def loaded(model, state):
    """The model with adapter weights `state` (adapter_state's) inside the block; its own after."""
    own = adapter_state(model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)
    try:
        yield model
    finally:
        with torch.no_grad():
            for name, value in own.items():
                params[name].copy_(value)


# ----------------------------------------------------------------------------- files
def save_adapter(model, directory, base=None):
    """The adapter into `directory` as peft saves it (adapter_model.safetensors with peft's tensor
    names, adapter_config.json naming `base`): small, and PeftModel.from_pretrained reads it."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = get_peft_model_state_dict(model)
    tensors = {}
    for name, value in state.items():
        tensors[PREFIX + name] = value.detach().contiguous().cpu()
    save_file(tensors, os.path.join(directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = model.peft_config["default"].to_dict()
    config["base_model_name_or_path"] = base
    for key, value in config.items():
        if isinstance(value, set):
            config[key] = sorted(value)
    with open(os.path.join(directory, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2, default=str)  # dtypes, paths -> str


def load_adapter(model, directory):
    """A saved adapter's weights (save_adapter's files) into the model's LoRA layers, exactly; a
    rank or target mismatch is one line."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    path = os.path.join(directory, ADAPTER_WEIGHTS)
    common.check(os.path.isfile(path), f"--resume {directory}: no {ADAPTER_WEIGHTS} (no LoRA run)")
    state = {}
    for name, value in load_file(path).items():
        state[name.removeprefix(PREFIX)] = value
    own = get_peft_model_state_dict(model)
    bad = sorted(set(own) ^ set(state))
    for name in set(own) & set(state):
        if own[name].shape != state[name].shape:
            bad.append(name)
    common.check(
        not bad,
        f"--resume {directory}: its adapter does not fit --lora-rank/--lora-targets ({len(bad)} "
        f"tensors differ, e.g. {bad[:1]}): resume with the run's own LoRA flags",
    )
    set_peft_model_state_dict(model, state)


def is_adapter_dir(directory):
    """Does `directory` hold a saved adapter (a LoRA run's checkpoint)?"""
    return os.path.isfile(os.path.join(directory, ADAPTER_CONFIG))


def export_merged(model, tokenizer, directory, run=None):
    """A plain HF model (W + (alpha / r) B A, the base's names) and its tokenizer into `directory`,
    for the evaluation scripts and serving; with `run` (a trainer's --out), EXPORT_MARKER names it
    there, so that run's next export may replace this one (check_export_dir). Returns the
    directory."""
    os.makedirs(directory, exist_ok=True)
    if run is not None:
        with open(os.path.join(directory, EXPORT_MARKER), "w") as f:
            json.dump({"run": os.path.realpath(run)}, f)
    model.save_pretrained(directory, state_dict=merged_state_dict(model))
    tokenizer.save_pretrained(directory)
    return directory


EXPORT_MARKER = ".exported_by_run.json"  # in an --export-merged directory: the run that wrote it


def check_export_dir(args):
    """--export-merged DIR, before anything loads: a new or empty directory, or one this run
    (--out) exported to before (a resumed run exports again); never a file, never a directory
    holding anyone else's files, which the export would overwrite or mix with."""
    directory = args.export_merged
    if not directory or not os.path.lexists(directory):
        return
    flag = f"--export-merged {directory}"
    common.check(os.path.isdir(directory), f"{flag}: is a file; pass a new or empty directory")
    entries = sorted(os.listdir(directory))
    if not entries:
        return
    run = None
    try:
        with open(os.path.join(directory, EXPORT_MARKER)) as f:
            run = json.load(f).get("run")
    except (OSError, ValueError, AttributeError):
        pass
    shown = ", ".join(entries[:3])
    if len(entries) > 3:
        shown += f", ... ({len(entries)} in all)"
    common.check(
        run == os.path.realpath(args.out),
        f"{flag} holds files this run did not export ({shown}): pass a new or empty directory",
    )
