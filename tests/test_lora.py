"""lora.py through grpo.py's main, in-process with --engine hf (the engine is not the point here):
a LoRA run stopped and resumed equals the straight run (the adapter checkpoint and its
adapter-only optimizer state), --export-merged writes a plain HF model, --qlora off CUDA is one
line. The engine-side tests (the merged push, the KL reference, the adapter-only optimizer) use
the live vLLM engine of tests/test_grpo.py."""

import json
import os

import pytest
import torch

import grpo
import lora
from test_grpo import KEYWORD, metrics, tiny_flags, train_metrics


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    """test_grpo's keyword task (reward 1 when the response contains KEYWORD)."""
    path = tmp_path_factory.mktemp("kw") / "task.jsonl"
    with open(path, "w") as f:
        for i in range(64):
            row = {"question": f"Write about {i} and {i + 3}.", "ground_truth": [KEYWORD]}
            f.write(json.dumps(row) + "\n")
    return str(path)


def lora_run(model, task, out, *extra):
    """grpo.main on the tiny keyword task with a rank-4 LoRA, in this process."""
    flags = tiny_flags(model, task, "--engine", "hf", "--lora-rank", "4", "--eval-every", "0")
    flags += ["--rollout-batch-size", "8", "--train-batch-size", "8", "--max-tokens", "6"]
    flags += ["--min-tokens", "1", "--kl-every", "1", "--eval-n", "2", "--out", str(out), *extra]
    # a gradient without the keyword: every response past 2 tokens is penalised (DAPO's soft
    # length penalty), and no_baseline trains on that raw reward
    flags += ["--loss", "no_baseline", "--no-std-norm", "--overlong-buffer", "4"]
    grpo.main(grpo.parse_args(flags))


def test_lora_resume_equals_the_straight_run_and_exports_a_plain_model(
    tiny_model_dir, task_file, tmp_path
):
    """2 steps, then a resume to 3, against 3 straight: the same metrics and the same merged
    model (--export-merged) to the bit; the checkpoint holds the adapter, not the model."""
    from transformers import AutoModelForCausalLM

    lora_run(tiny_model_dir, task_file, tmp_path / "a", "--n-grpo-steps", "2")
    ckpt = tmp_path / "a" / "checkpoint"
    assert lora.is_adapter_dir(ckpt) and not (ckpt / "model.safetensors").exists()
    resume = ["--resume", str(tmp_path / "a"), "--n-grpo-steps", "3"]
    grpo.main(grpo.parse_args([*resume, "--export-merged", str(tmp_path / "ma")]))
    lora_run(
        tiny_model_dir,
        task_file,
        tmp_path / "b",
        "--n-grpo-steps",
        "3",
        "--export-merged",
        str(tmp_path / "mb"),
    )
    resumed = train_metrics(metrics(tmp_path / "a"))
    straight = train_metrics(metrics(tmp_path / "b"))
    assert [r["step"] for r in resumed] == [0, 1, 2]
    for a, b in zip(resumed, straight):
        for key in ("train/loss", "train/grad_norm", "train/kl_ref", "train/reward"):
            assert a[key] == b[key], key
    ma = AutoModelForCausalLM.from_pretrained(tmp_path / "ma", dtype=torch.float32).state_dict()
    mb = AutoModelForCausalLM.from_pretrained(tmp_path / "mb", dtype=torch.float32).state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert set(ma) == set(base)
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    assert not all(torch.equal(ma[k], base[k]) for k in ma)  # trained


def test_export_merged_never_overwrites_the_users_files(tmp_path, capsys):
    """Issue 44: --export-merged DIR overwrote the user's model.safetensors and config.json there,
    and pointed at a file it trained the whole run, then raised. Now both are one line at parse
    time; an empty folder, or this run's own earlier export (a resume exports again), is fine."""
    import json

    import lora

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    (mine / "model.safetensors").write_text("weights")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    out = str(tmp_path / "run")
    for target, needle in ((mine, "holds files this run did not export"), (a_file, "is a file")):
        with pytest.raises(SystemExit):
            grpo.parse_args(["--out", out, "--export-merged", str(target)])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--export-merged {target}" in err and needle in err
    assert (mine / "model.safetensors").read_text() == "weights"
    ours = tmp_path / "ours"
    ours.mkdir()
    grpo.parse_args(["--out", out, "--export-merged", str(ours)])  # empty
    (ours / "config.json").write_text("{}")
    (ours / lora.EXPORT_MARKER).write_text(json.dumps({"run": os.path.realpath(out)}))
    grpo.parse_args(["--out", out, "--export-merged", str(ours)])  # this run's
    with pytest.raises(SystemExit):  # another run's export
        grpo.parse_args(["--out", str(tmp_path / "other"), "--export-merged", str(ours)])


def test_qlora_off_cuda_is_one_line(tiny_model_dir, task_file, capsys):
    args = grpo.parse_args(tiny_flags(tiny_model_dir, task_file, "--lora-rank", "4", "--qlora"))
    with pytest.raises(SystemExit):
        grpo.setup_runtime(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--qlora needs a CUDA policy device" in err[0]


def test_a_resume_keeps_the_runs_lora_settings(tmp_path, capsys):
    """Checked before anything loads: a LoRA checkpoint resumes with LoRA and its alpha, a full
    one without LoRA; --keep-checkpoints is refused under LoRA."""
    import argparse
    import json

    import lora

    adapter = tmp_path / "lora_ckpt"
    adapter.mkdir()
    (adapter / lora.ADAPTER_CONFIG).write_text(json.dumps({"r": 4, "lora_alpha": 32}))
    full = tmp_path / "full_ckpt"
    full.mkdir()
    base = dict(lora_dropout=0.0, qlora=False, keep_checkpoints=0, lora_alpha=32.0)
    cases = [
        (dict(resume=str(adapter), lora_rank=0), "is a LoRA run: resume it with its --lora-rank"),
        (dict(resume=str(full), lora_rank=4), "is a full fine-tuning run: drop --lora-rank"),
        (dict(resume=str(adapter), lora_rank=4, lora_alpha=16.0), "differs from the run's 32"),
        (dict(resume=None, lora_rank=4, keep_checkpoints=2), "use --export-merged"),
    ]
    for flags, needle in cases:
        with pytest.raises(SystemExit):
            lora.check_flags(argparse.Namespace(**(base | flags)))
        assert needle in capsys.readouterr().err, flags
    lora.check_flags(argparse.Namespace(**(base | dict(resume=str(adapter), lora_rank=4))))
    lora.check_flags(argparse.Namespace(**(base | dict(resume=str(full), lora_rank=0))))


def test_lora_flags_are_checked_in_one_line(capsys):
    with pytest.raises(SystemExit):
        grpo.parse_args(["--qlora"])
    assert "--qlora trains adapters" in capsys.readouterr().err
    assert os.path.basename(lora.ADAPTER_WEIGHTS) == "adapter_model.safetensors"
