"""FSDP2 sharding of a learner over the learner group (grpo_ray.py --learner-sharding fsdp): every
learner holds 1/M of the fp32 master weights, their gradients and AdamW state, and of the frozen
copies; the full weights are gathered parameter by parameter for the engines; each learner saves
and loads its own shard.

The group is torch.distributed's default group, owned by the M disaggregated learners (no engine
in their processes). A colocated actor cannot shard: its vLLM engine owns that default group
(world size 1), and a group built beside it (grpo_ray.py's TCPStore group) is no c10d group that a
DeviceMesh can span: c10d maps a group's ranks through the default world's, in which every
colocated learner is rank 0. Tried on torch 2.13 (two processes, each with its own world-1 default
group, as vLLM makes it): DeviceMesh.from_group refuses a bare ProcessGroupGloo; registered by
hand in c10d's private tables, the group gave both learners rank 0 and mesh coordinate 0 (both
would hold shard 0), and FSDP2's first collective failed to resolve the group's name. So
grpo_ray.py refuses --learner-sharding fsdp there.

Numerics are those of one learner: the parameters stay fp32 and are all-gathered in fp32, the
forward runs under the same autocast as unsharded (no FSDP mixed-precision policy), and the
reduce-scatter sums the learners' gradients (each learner's loss already carries its share of the
step's rows, as grpo.py's all-reduce sums them).
"""

import os

import torch

import common
import losses


def shard(model, mesh):
    """model, sharded in place over `mesh` (a 1-D DeviceMesh of the learners) and returned: each
    decoder layer (the classes its _no_split_modules names) a fully_shard unit, the root (the
    embeddings, the final norm and the head, tied or not) one more. Parameters become DTensors
    sharded on dim 0; a layer gathers its own in its forward and again in its backward."""
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

    # the log-prob fast path's self-checks run whole forwards: on the model as loaded, once
    losses.shared_prefix_works(model)
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = []
    for module in model.modules():
        if type(module).__name__ in names:
            layers.append(module)
    common.check(
        layers,
        f"--learner-sharding fsdp: {type(model).__name__} names no decoder layer class "
        "(_no_split_modules): use --learner-sharding replicate",
    )
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # the reduce-scatter sums the learners' gradients (not FSDP's mean), with a plain SUM:
            # gloo has neither AVG nor NCCL's PREMUL_SUM
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    # losses.get_response_log_probs' fast path runs the body (model.base_model) and then reads the
    # head's weight, bypassing the root's forward. It calls this instead: the body inside the
    # root's FSDP hooks, which gather the root's parameters and (the root's default) keep them
    # gathered until the backward, so the head weight it reads next is the whole one
    model.gathering_body = model.base_model.__call__
    register_fsdp_forward_method(model, "gathering_body")
    return model


def is_sharded(model):
    """Is this model sharded (by `shard`)?"""
    if not hasattr(model, "gathering_body"):  # shard's mark: unsharded, nothing to import
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def reshard(*models):
    """Put each sharded model's parameters back in their shards (None and unsharded models are
    skipped). FSDP2 keeps a root's parameters gathered from a forward until the backward: after a
    no-grad pass, the model's state dict and parameters would be the gathered root tensors."""
    for model in models:
        if model is None or not hasattr(model, "gathering_body"):  # not sharded: nothing to do
            continue
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


def _local(value):
    """A DTensor's local shard (else the value itself)."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.to_local()
    return value


def full_state_dict(model, keep):
    """{name: full CPU tensor} of a sharded model's state dict, gathered one tensor at a time: every
    learner must call it (each gather is a collective), and only where `keep` (learner 0) are the
    tensors kept, so no other learner ever holds more than one whole tensor. Tied names share one
    tensor, gathered once."""
    from torch.distributed.tensor import DTensor

    reshard(model)
    out = {}
    done = {}  # id of a tensor gathered already -> its copy where kept (tied weights), else None
    for name, value in model.state_dict().items():
        if id(value) in done:
            full = done[id(value)]
        elif isinstance(value, DTensor):
            full = value.full_tensor().detach().cpu()
        else:
            full = value.detach().cpu()
        if not keep:
            full = None  # freed now: the next gather reuses the memory
        done[id(value)] = full
        if keep:
            out[name] = full
    return out


def held_bytes(model, optimizer=None):
    """Bytes of the tensors this learner holds: its shard of the model's parameters and buffers,
    and of the optimizer's state (the whole tensors when unsharded)."""
    tensors = {}
    for t in list(model.parameters()) + list(model.buffers()):
        tensors[id(t)] = _local(t)
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    tensors[id(value)] = _local(value)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def shard_name(rank, world):
    """The file of learner `rank`'s shard in a checkpoint."""
    return f"shard_{rank}_of_{world}.pt"


def save_shard(path, model, optimizer):
    """This learner's shard of the model (its state dict's local tensors) and of the optimizer's
    state (the same, keyed as optimizer.state_dict() keys it) into one torch file at `path`."""
    reshard(model)
    weights = {}
    for name, value in model.state_dict().items():
        weights[name] = _local(value).detach().cpu()
    opt = optimizer.state_dict()
    state = {}
    for index, entry in opt["state"].items():
        state[index] = {}
        for key, value in entry.items():
            if torch.is_tensor(value):
                value = _local(value).detach().cpu()
            state[index][key] = value
    torch.save({"model": weights, "optimizer": {**opt, "state": state}}, path)


def load_shard(path, model, params):
    """This learner's shard from `path` (save_shard's file, written by the learner of this rank in
    a group of this size) into the sharded model; -> the optimizer state dict to load, its tensors
    DTensors again like the parameters they belong to (params: the optimizer's parameters, in its
    order)."""
    from torch.distributed.tensor import DTensor

    saved = torch.load(path, map_location="cpu", weights_only=True)
    reshard(model)
    own = model.state_dict()
    common.check(
        set(own) == set(saved["model"]),
        f"{path}: its tensors are not this model's: resume with the run's own --model",
    )
    with torch.no_grad():
        for name, value in own.items():
            local = _local(value)
            common.check(
                local.shape == saved["model"][name].shape,
                f"{path}: {name} is {tuple(saved['model'][name].shape)} here, "
                f"{tuple(local.shape)} in this learner's shard: resume with the run's own "
                "--num-learners and --model",
            )
            local.copy_(saved["model"][name])
    opt = saved["optimizer"]
    state = {}
    for index, entry in opt["state"].items():
        p = params[index]
        state[index] = dict(entry)
        for key, value in entry.items():
            if isinstance(p, DTensor) and torch.is_tensor(value) and value.dim() > 0:
                state[index][key] = DTensor.from_local(
                    value.to(p.device),
                    p.device_mesh,
                    p.placements,
                    run_check=False,
                    shape=p.shape,
                    stride=p.stride(),
                )
    return {**opt, "state": state}


def local_path(directory, rank, world):
    """The path of learner `rank`'s shard in a checkpoint directory."""
    return os.path.join(directory, shard_name(rank, world))
