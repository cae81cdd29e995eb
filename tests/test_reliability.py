"""Issue 16's probes, run as the commands a user types: each bad input is refused with exactly one
`error:` line on stderr and a non-zero exit, fast (before any model loads: the model directories
here hold junk weights, so a load would end in a traceback), and no run loses data (checkpoints
written whole, no temp files left behind). And a run saved by older code (tests/compat/) resumes."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

import common
from conftest import ROOT, one_line_error


def run(script, *args, timeout=60, fast=20):
    """Run a root script; it must finish within `fast` seconds (refused before a model loads)."""
    argv = [sys.executable, os.path.join(ROOT, script)] + [str(a) for a in args]
    t0 = time.time()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    took = time.time() - t0
    assert took < fast, (script, args, took, r.stderr[-500:])
    return r


def fake_model(d, config='{"model_type": "qwen2"}'):
    """A directory that passes for a model until something loads it (its weights are junk)."""
    os.makedirs(d, exist_ok=True)
    files = [("config.json", config), ("model.safetensors", "junk"), ("tokenizer.json", "{}")]
    for name, text in files:
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    return str(d)


def fake_run(d, state='{"step": 1, "args": {}}', metrics='{"step": 0}\n{"step": 1}\n'):
    """A run directory with a checkpoint as grpo.py / sft.py / grpo_ray.py leave it (junk weights
    and optimizer)."""
    ckpt = fake_model(d / "checkpoint")
    files = [("optimizer.pt", "junk"), ("scheduler.pt", "junk"), ("state.json", state)]
    for name, text in files:
        with open(os.path.join(ckpt, name), "w") as f:
            f.write(text)
    (d / "metrics.jsonl").write_text(metrics)
    return str(d)


# ----------------------------------------------------------------------------- models
@pytest.mark.parametrize(
    "script,config",
    [("grpo.py", "{}"), ("sft.py", '{"vocab_size": 8}'), ("eval_zero_shot.py", "{no")],
)
def test_junk_model_config_refused(script, config, tmp_path):
    r = run(script, "--model", fake_model(tmp_path / "m", config), "--out", tmp_path / "out")
    one_line_error(r, f"{tmp_path / 'm' / 'config.json'} is not JSON naming a model_type")


@pytest.mark.parametrize("script", ["grpo.py", "eval_zero_shot.py", "best_of_n.py"])
def test_unreachable_hub_id_is_one_line(script, tmp_path):
    """Offline here (online: the hub answers 404): one line, not from_pretrained's retries and a
    60-line traceback 30 s later. Only a run that starts asks the hub: dry runs of hub models stay
    offline (test_grpo, test_recipes)."""
    extra = []
    if script != "grpo.py":  # the evaluators load their data first, then ask for the model
        (tmp_path / "q.jsonl").write_text('{"question": "1 + 1?", "answer": "2 #### 2"}\n')
        extra = ["--task", "gsm8k", "--data", tmp_path / "q.jsonl"]
    r = run(script, "--model", "nosuchorg-8c1f/none", "--out", tmp_path / "out", *extra)
    one_line_error(r, "--model nosuchorg-8c1f/none")


def test_resume_asks_the_hub_only_for_a_model_it_loads(tmp_path):
    """A resumed grpo run loads its checkpoint; its saved hub --model loads (and is checked) only as
    a KL reference, so resuming on an offline node without that model cached works."""
    import grpo

    state = '{"step": 1, "args": {"model": "nosuchorg-8c1f/none"}}'
    run_dir = fake_run(tmp_path / "run", state=state)
    grpo.parse_args(["--resume", run_dir])
    common.check_hub_ids()  # nothing to ask
    grpo.parse_args(["--resume", run_dir, "--kl-every", "1"])
    with pytest.raises(SystemExit):
        common.check_hub_ids()


# --------------------------------------------------------------------------- resume and checkpoints
@pytest.mark.parametrize("script", ["grpo.py", "sft.py", "grpo_ray.py"])
def test_corrupt_state_json_on_resume(script, tmp_path):
    run_dir = fake_run(tmp_path / "run", state='{"step": 1, "ar')
    one_line_error(run(script, "--resume", run_dir), "state.json is corrupt")


@pytest.mark.parametrize("script", ["grpo.py", "sft.py"])
def test_corrupt_middle_metrics_line_on_resume(script, tmp_path):
    run_dir = fake_run(tmp_path / "run", metrics='{"step": 0}\n{"st\n{"step": 1}\n')
    one_line_error(run(script, "--resume", run_dir), "metrics.jsonl:2: corrupt line in the middle")


def test_grpo_ray_refuses_an_existing_run_without_resume(tmp_path):
    run_dir = fake_run(tmp_path / "run")
    one_line_error(run("grpo_ray.py", "--out", run_dir), "already holds a run")


def test_half_written_state_json_is_not_a_complete_checkpoint(tmp_path):
    """A crash between a swap's two renames leaves checkpoint.old and checkpoint.tmp; a tmp whose
    state.json was cut short is not the complete copy (the older one is), and state.json itself is
    written whole or not at all."""
    run_dir = tmp_path / "run"
    copies = [("checkpoint.old", '{"step": 1}'), ("checkpoint.tmp", '{"step": 2, "ar')]
    for name, state in copies:
        (run_dir / name).mkdir(parents=True)
        (run_dir / name / "state.json").write_text(state)
    path = common.find_checkpoint(str(run_dir))
    with open(os.path.join(path, "state.json")) as f:
        assert json.load(f)["step"] == 1
    assert sorted(os.listdir(run_dir)) == ["checkpoint"]
    # killed while state.json is serialised (kill -9, power loss: no cleanup runs)
    code = f"""if True:
        import argparse, os, common
        class Bomb(dict):
            def items(self):
                os._exit(9)
        class Model:
            def save_pretrained(self, d):
                open(os.path.join(d, "model.safetensors"), "w").write("w")
        state = {{"step": 2, "z": Bomb(a=1)}}
        common.save_model_checkpoint(
            {str(run_dir)!r}, Model(), Model(), argparse.Namespace(), state
        )
    """
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 9
    # no state.json: not taken for complete
    assert os.listdir(run_dir / "checkpoint.tmp") == ["model.safetensors"]
    assert common.find_checkpoint(str(run_dir)) == str(run_dir / "checkpoint")
    assert not (run_dir / "checkpoint.tmp").exists()


# a grpo.py run saved by the code before the runtime record (commit f82a54e, which resolved the
# devices, dtypes and --shared-prefix onto args): its args.json and checkpoint/state.json, made with
# `python grpo.py --out /tmp/oldrun --n-grpo-steps 1 --save-every 1 --engine hf` + OLD_RUN_FLAGS on
# the tiny Qwen2 and the keyword task below (weights, metrics and rollouts left out)
OLD_RUN = os.path.join(ROOT, "tests", "compat", "grpo_f82a54e")
OLD_RUN_FLAGS = [
    "--task jsonl",
    "--prompt question_only",
    "--reward keyword",
    "--rollout-batch-size 8",
    "--group-size 4",
    "--train-batch-size 8",
    "--gradient-accumulation-steps 2",
    "--max-tokens 16",
    "--min-tokens 2",
    "--eval-n 4",
    "--eval-every 1",
    "--lr 1e-3",
    "--policy-device cpu",
    "--grader-workers 0",
]


def test_a_run_saved_before_the_runtime_record_resumes(tiny_model_dir, tmp_path):
    """Issue 25: a run whose saved flags hold the values the old code resolved onto args
    (vllm_device, shared_prefix, and the param_dtype/compute_dtype that are no flags now) resumes
    with the same settings and runtime, and logs its next step."""
    task = tmp_path / "task.jsonl"
    rows = []
    for i in range(64):
        rows.append(json.dumps({"question": f"Numbers {i} and {i + 3}.", "ground_truth": ["the"]}))
    task.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    paths = {"model": tiny_model_dir, "train_path": str(task), "val_path": str(task)}
    flags = ["--out", out, "--n-grpo-steps", 1, "--save-every", 1, "--engine", "hf"]
    for name, value in paths.items():
        flags += ["--" + name.replace("_", "-"), value]
    for flag in OLD_RUN_FLAGS:
        flags += flag.split()
    first = run("grpo.py", *flags, timeout=600, fast=600)
    assert first.returncode == 0, first.stderr[-3000:]
    with open(out / "args.json") as f:
        new_args = json.load(f)
    with open(out / "runtime.json") as f:
        new_runtime = json.load(f)
    # the old run's files in place of the new ones, pointed at this test's model, data and run
    for name in ("args.json", os.path.join("checkpoint", "state.json")):
        with open(os.path.join(OLD_RUN, name)) as f:
            saved = json.load(f)
        old_args = saved.get("args", saved)  # state.json holds the flags under "args"
        old_args.update(paths, out=str(out))
        with open(out / name, "w") as f:
            json.dump(saved, f)
    resumed = run("grpo.py", "--resume", out, "--n-grpo-steps", 2, timeout=600, fast=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    assert "resume: restored the run's flags" in resumed.stdout
    with open(out / "metrics.jsonl") as f:
        logged = [json.loads(line) for line in f]
    steps = []
    for row in logged:
        if "train/loss" in row:
            steps.append(row["step"])
    assert steps == [0, 1]  # the old checkpoint's step, then the resumed one
    # the same run: the runtime record the new code's own first step had, and every flag the
    # resumed run took from the old files equal to the new code's, or to the runtime value the old
    # code had resolved onto args
    with open(out / "runtime.json") as f:
        assert json.load(f) == new_runtime
    with open(out / "args.json") as f:
        restored = json.load(f)  # rewritten by the resumed run: its flags, no derived dtypes
    assert set(restored) == set(new_args)
    changed_by_the_resume = {"resume", "n_grpo_steps"}
    for k in sorted(set(new_args) - changed_by_the_resume):
        assert restored[k] == old_args[k], k
        assert old_args[k] == new_args[k] or old_args[k] == new_runtime.get(k), k


# ----------------------------------------------------------------------------- sft sizes
def test_sft_max_seq_len_below_every_example(tmp_path):
    flags = ["--max-seq-len", "5", "--countdown-n", "16", "--eval-n", "0"]
    r = run("sft.py", *flags, "--out", tmp_path / "out")
    one_line_error(r, "only 0 pairs fit --max-seq-len 5: raise it to at least")
    assert "--batch-size" not in r.stderr


# ----------------------------------------------------------------------------- kissing.py
@pytest.mark.parametrize("out", ["adir", "nodir/x.json"])
def test_kissing_construct_checks_out_before_computing(out, tmp_path):
    (tmp_path / "adir").mkdir()
    flags = ["--method", "shell-search", "--seconds", "30", "--out", tmp_path / out]
    r = run("kissing.py", "construct", *flags)
    one_line_error(r, "--out")
    assert os.listdir(tmp_path) == ["adir"], "a failed write left a file behind"
    assert not os.listdir(tmp_path / "adir"), "a failed write left a file behind"


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SEARCH_BAD_INPUTS = [
    # a corrupt log
    ("--llm {url} --model m --resume --out-dir {tmp}/log", "is not a search log"),
    # a file, not a directory
    ("--llm {url} --model m --out-dir {tmp}/afile", "--out-dir"),
    # a local model directory without a model
    ("--llm local:{tmp}/notmodel --engine hf --out-dir {tmp}/out", "no config.json"),
]


@pytest.mark.parametrize("argv,needle", SEARCH_BAD_INPUTS)
def test_kissing_search_bad_inputs(argv, needle, tmp_path):
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "conversation_log.json").write_text('{"args": {"mode": "refine"}, "entr')
    (tmp_path / "afile").write_text("x")
    (tmp_path / "notmodel").mkdir()
    url = f"openai:http://127.0.0.1:{closed_port()}/v1"
    argv = argv.format(url=url, tmp=tmp_path).split()
    one_line_error(run("kissing.py", "search", *argv), needle)


def test_kissing_search_stops_when_its_server_is_gone(tmp_path):
    """An unreachable server: the client's retries, then one line and a non-zero exit; no error
    text is evaluated."""
    url = f"openai:http://127.0.0.1:{closed_port()}/v1"
    flags = ["--llm", url, "--model", "m", "--iters", "2", "--out-dir", tmp_path]
    r = run("kissing.py", "search", *flags)
    one_line_error(r, "3 calls failed in a row")
    assert not (tmp_path / "conversation_log.json").exists()
