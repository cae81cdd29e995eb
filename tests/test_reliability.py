"""Issue 16's probes, run as the commands a user types: each bad input is refused with exactly one
`error:` line on stderr and a non-zero exit, fast (before any model loads: the model directories
here hold junk weights, so a load would end in a traceback), and no run loses data (checkpoints
written whole, no temp files left behind). And a run saved by older code (tests/compat/) resumes.

Issue 26's: a run directory is held by one run at a time (a second one is refused naming the
first's pid; a killed run's lock is free), a run without a checkpoint is never stuck, --resume
checks the script, state.json and every metrics row before it touches a file, and a full or
read-only disk (real ones: a small tmpfs, a read-only bind mount) is one line that leaves the run
resumable."""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

import common
import grpo
import runs
from conftest import ROOT, one_line_error, run_script


def run(script, *args, fast=20):
    """Run a root script in this process (conftest.run_script); it must finish within `fast`
    seconds (refused before a model loads)."""
    t0 = time.time()
    r = run_script([script, *args])
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
    (d / "run.lock").write_text("")  # the project's run marker (runs.check_is_run)
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
    path = runs.find_checkpoint(str(run_dir))
    with open(os.path.join(path, "state.json")) as f:
        assert json.load(f)["step"] == 1
    assert sorted(os.listdir(run_dir)) == ["checkpoint"]
    # killed while state.json is serialised (kill -9, power loss: no cleanup runs)
    code = f"""if True:
        import argparse, os, runs
        class Bomb(dict):
            def items(self):
                os._exit(9)
        class Model:
            def save_pretrained(self, d):
                open(os.path.join(d, "model.safetensors"), "w").write("w")
            def named_modules(self):  # no LoRA layer (lora.lora_layers)
                return iter(())
        state = {{"step": 2, "z": Bomb(a=1)}}
        runs.save_model_checkpoint(
            {str(run_dir)!r}, Model(), Model(), argparse.Namespace(), state
        )
    """
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 9
    # no state.json: not taken for complete
    assert os.listdir(run_dir / "checkpoint.tmp") == ["model.safetensors"]
    assert runs.find_checkpoint(str(run_dir)) == str(run_dir / "checkpoint")
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
    first = run("grpo.py", *flags, fast=600)
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
    resumed = run("grpo.py", "--resume", out, "--n-grpo-steps", 2, fast=600)
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
    # settings added since the old run was saved (--threads; resolve's derived ones): the new
    # code's values, and a notice names each flag among them
    newer = set(new_args) - set(old_args)
    flags = {action.dest for action in grpo.parser()._actions}
    for k in sorted(newer):
        assert restored[k] == new_args[k], k
        if k not in flags:
            continue  # derived by resolve: no flag to name
        # the notice gives the flag's default: its value, or None where resolve derives it (adv_std
        # from the old run's std_norm)
        named = f"{k}={new_args[k]!r}" in resumed.stdout or f"{k}=None" in resumed.stdout
        assert named, k
    # --std-norm is now a spelling of --adv-std (its default None): the old run's std_norm=True
    # resumes as --adv-std group, which a new run takes by default
    assert old_args["std_norm"] is True and new_args["std_norm"] is None
    assert restored["adv_std"] == new_args["adv_std"] == "group"
    spellings = {"std_norm"}
    for k in sorted(set(new_args) - changed_by_the_resume - newer - spellings):
        assert restored[k] == old_args[k], k
        assert old_args[k] == new_args[k] or old_args[k] == new_runtime.get(k), k


# ----------------------------------------------------------------------------- sft sizes
def test_sft_max_seq_len_below_every_example(tmp_path):
    """Refused before the model loads. The embedded model's tokenizer and config beside junk
    weights: a load would end in a traceback, which one_line_error refuses. That is the property,
    so no tight wall-clock bound stands in for it (sft.py imports torch and tokenizes the examples
    first: 20 s was too little on a loaded machine); the bound left only catches a hang."""
    model = tmp_path / "model"
    shutil.copytree(os.path.join(ROOT, "models", "countdown-tiny"), model)
    (model / "model.safetensors").write_text("junk")
    flags = ["--model", model, "--max-seq-len", "5", "--countdown-n", "16", "--eval-n", "0"]
    r = run("sft.py", *flags, "--out", tmp_path / "out", fast=300)
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
    # --threads with a server: no engine here to apply it to
    ("--llm {url} --model m --threads 1 --out-dir {tmp}/out", "--llm openai runs no model"),
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


# --------------------------------------------------------------------------- one run per directory
# issue 26: two runs started 2 s apart on one --out both exited 0, their rows mixed in one
# metrics.jsonl. Now the first to start holds <out>/run.lock (runs.lock_run_dir) for its life.
HOLD = """if True:
    import sys, time, runs
    runs.claim_run_dir(sys.argv[1], resume=sys.argv[2:])  # resume: a second argument
    print("claimed", flush=True)
    time.sleep(300)
"""


def hold(out, *resume):
    """A process that claims `out` as a run's start does, then keeps running (the first run)."""
    argv = [sys.executable, "-c", HOLD, str(out), *resume]
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "claimed"
    return p


def stop_holder(p):
    p.kill()
    p.wait()
    p.stdout.close()


# (grpo_ray.py claims through the same call, before Ray starts; its refusal of an existing run
# above shows it gets there; the evaluators hold their --out the same way, before they load)
SECOND_RUNS = [
    ("grpo.py", []),
    ("sft.py", ["--countdown-n", "16", "--eval-n", "0"]),
    ("eval_zero_shot.py", []),
    ("best_of_n.py", []),
]


@pytest.mark.parametrize("script,flags", SECOND_RUNS)
def test_a_second_run_on_one_out_is_refused_naming_the_first(script, flags, tmp_path):
    out = tmp_path / "run"
    first = hold(out)
    try:
        r = run(script, "--out", out, *flags)
    finally:
        stop_holder(first)
    one_line_error(r, f"--out {out} is in use by another run (pid {first.pid}")
    assert sorted(os.listdir(out)) == ["run.lock"], "the refused run wrote into the first one's"


def test_a_second_resume_of_a_run_is_refused_before_it_touches_the_run(tmp_path):
    run_dir = fake_run(tmp_path / "run")
    os.makedirs(tmp_path / "run" / "checkpoint.old")  # a leftover a resume would clear
    first = hold(run_dir, "resume")
    try:
        r = run("grpo.py", "--resume", run_dir)
    finally:
        stop_holder(first)
    one_line_error(r, f"--resume {run_dir} is in use by another run (pid {first.pid}")
    assert (tmp_path / "run" / "checkpoint.old").is_dir()


def test_the_lock_of_a_killed_run_is_stale(tmp_path):
    """kill -9 leaves run.lock behind, naming the dead run; the lock itself died with it."""
    out = tmp_path / "run"
    first = hold(out)
    stop_holder(first)
    assert runs.read_claim(str(out))["pid"] == first.pid
    try:
        runs.claim_run_dir(str(out))
        runs.claim_run_dir(str(out))  # grpo_ray.py claims twice: one process, one claim
        assert runs.read_claim(str(out))["pid"] == os.getpid()
    finally:
        runs.release_run_dir(str(out))


def test_a_process_the_holder_started_may_use_the_directory(tmp_path):
    """A test or notebook that ran a main() in-process, then the script on its run: the holder
    (this process) is waiting on the child, which is not a second run."""
    out = str(tmp_path / "run")
    runs.claim_run_dir(out)
    try:
        child = subprocess.run([sys.executable, "-c", HOLD.replace("300", "0"), out], cwd=ROOT)
    finally:
        runs.release_run_dir(out)
    assert child.returncode == 0


# ------------------------------------------------------------------------- a run without checkpoint
def a_run_that_never_saved(run_dir, rows):
    """What grpo.py leaves when it is killed before its first save: args.json, runtime.json,
    `rows` logged rows, no checkpoint."""
    import grpo

    args = grpo.parse_args(["--lr", "0.5", "--out", str(run_dir), "--n-grpo-steps", "7"])
    os.makedirs(run_dir)
    (run_dir / "args.json").write_text(json.dumps(runs.jsonable(vars(args))))
    (run_dir / "runtime.json").write_text("{}")
    lines = []
    for step in range(rows):
        lines.append(json.dumps({"step": step, "train/loss": 1.0}) + "\n")
    (run_dir / "metrics.jsonl").write_text("".join(lines))
    (run_dir / "run.lock").write_text("")  # the project's run marker (runs.check_is_run)


def test_resume_of_a_run_without_checkpoint_restarts_it_from_step_0(tmp_path, capsys):
    import grpo

    run_dir = tmp_path / "run"
    a_run_that_never_saved(run_dir, rows=2)
    try:
        args = grpo.parse_args(["--resume", str(run_dir)])
        assert args.resume is None  # the trainers start it as a new run
        assert args.lr == 0.5  # with its flags
        assert args.n_grpo_steps == 7
        assert args.out == str(run_dir)
        out = capsys.readouterr().out
        assert "no checkpoint (the run stopped before its first save): restarting it" in out
        assert "its 2 logged rows are dropped" in out
        runs.claim_run_dir(args.out, args.resume)
        assert (run_dir / "metrics.jsonl").read_text() == ""
    finally:
        runs.release_run_dir(str(run_dir))


def test_a_new_run_takes_over_a_directory_whose_run_failed_at_start(tmp_path, capsys):
    run_dir = tmp_path / "run"
    a_run_that_never_saved(run_dir, rows=0)
    try:
        runs.claim_run_dir(str(run_dir))
        assert "stopped before its first logged row: starting afresh" in capsys.readouterr().out
    finally:
        runs.release_run_dir(str(run_dir))
    # with logged rows the run is refused, and told the way: --resume
    logged = tmp_path / "logged"
    a_run_that_never_saved(logged, rows=3)
    with pytest.raises(SystemExit):
        runs.claim_run_dir(str(logged))
    runs.release_run_dir(str(logged))
    err = capsys.readouterr().err
    assert "3 logged rows, no checkpoint: --resume restarts it from step 0" in err
    assert (logged / "metrics.jsonl").read_text().count("\n") == 3


def a_users_folder(d):
    """A folder of the user's own, shaped like a run: checkpoint/, a step-keyed metrics.jsonl
    (another tool's), rollouts/; no run.lock."""
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / "notes.txt").write_text("mine")
    (d / "rollouts").mkdir()
    (d / "rollouts" / "step_0.jsonl").write_text("{}\n")
    (d / "metrics.jsonl").write_text('{"step": 0, "loss": 2.0}\n{"step": 1, "loss": 1.5}\n')
    return bytes_of(str(d))


def test_a_folder_without_the_run_marker_is_never_taken_for_a_run(tmp_path, capsys):
    """Issue 44: `--out DIR` holding the user's own checkpoint/, metrics.jsonl and rollouts/ was
    taken for a run that stopped early (a file deleted, the rest overwritten), and --resume of
    another tool's step-keyed metrics.jsonl deleted its rows. Now both are one line, nothing
    touched; an empty folder is still a fine --out."""
    import grpo

    d = tmp_path / "mine"
    before = a_users_folder(d)
    args = grpo.parse_args(["--out", str(d)])
    with pytest.raises(SystemExit):
        runs.claim_run_dir(args.out, args.resume)
    with pytest.raises(SystemExit):
        grpo.parse_args(["--resume", str(d)])
    err = capsys.readouterr().err
    assert err.count("\n") == 2, err
    assert f"--out {d} is not empty and is not a run of this project" in err
    assert f"--resume {d} is not empty and is not a run of this project" in err
    assert bytes_of(str(d)) == before
    assert not (d / "run.lock").exists()
    # a run saved before runs carried run.lock is still one (its checkpoint's state.json says
    # so); a folder holding only hidden files is empty
    legacy = tmp_path / "legacy"
    fake_run(legacy, state='{"step": 1, "args": {}, "script": "grpo.py"}')
    os.remove(legacy / "run.lock")
    grpo.parse_args(["--resume", str(legacy), "--dry-run"])
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / ".gitkeep").write_text("")
    try:
        assert runs.claim_run_dir(str(hidden)) == str(hidden)
    finally:
        runs.release_run_dir(str(hidden))
    empty = tmp_path / "empty"
    empty.mkdir()
    try:
        assert runs.claim_run_dir(str(empty)) == str(empty)
        assert (empty / "run.lock").exists()  # the marker: from now on a run of this project
    finally:
        runs.release_run_dir(str(empty))


# --------------------------------------------------------------------------- --resume checks first
@pytest.mark.parametrize(
    "saved,needle",
    [
        ({"n_grpo_steps": -5}, "--n-grpo-steps -5: '-5' is not an integer > 0"),
        ({"lr": "abc"}, "--lr 'abc': 'abc' is not a finite number > 0"),
        ({"loss": "nope"}, "--loss 'nope', not one of"),
        ({"mask_truncated": "yes"}, "--mask-truncated 'yes', not true or false"),
        ({"shared_prefix": "yes"}, "--shared-prefix 'yes', not true or false"),
        ({"threads": 50000}, "pass --threads on this command line"),
    ],
)
def test_restored_flags_pass_the_checks_typed_ones_do(saved, needle, tmp_path, capsys):
    """Issue 44: a saved run's flags were restored unchecked (n_grpo_steps -5 logged a step -5
    row; a string lr was a traceback)."""
    import grpo

    state = json.dumps({"step": 1, "args": saved})
    run_dir = fake_run(tmp_path / "run", state=state)
    with pytest.raises(SystemExit):
        grpo.parse_args(["--resume", run_dir])
    runs.release_run_dir(run_dir)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_a_resume_stays_in_its_run_and_never_goes_back_in_steps(tmp_path, capsys):
    """Issue 44: `--resume A --out B` forked B without A's rows; a finished 6-step run resumed with
    --n-grpo-steps 3 logged a second "step 3" eval of the step-6 model. Both are one line now,
    before any file changes."""
    import grpo

    run_dir = fake_run(tmp_path / "run", state='{"step": 6, "args": {}}')
    before = bytes_of(run_dir)
    for argv, needle in (
        (["--out", str(tmp_path / "b")], "a resumed run continues in its own directory"),
        (["--n-grpo-steps", "3"], "has trained 6 steps, more than --n-grpo-steps 3"),
    ):
        with pytest.raises(SystemExit):
            grpo.parse_args(["--resume", run_dir, *argv])
        runs.release_run_dir(run_dir)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
    assert bytes_of(run_dir) == before
    assert not (tmp_path / "b").exists()
    args = grpo.parse_args(["--resume", run_dir, "--out", run_dir, "--n-grpo-steps", "6"])
    runs.release_run_dir(run_dir)
    assert args.out == run_dir


def bytes_of(run_dir):
    """Every file under run_dir -> its bytes (what a refused resume must leave as it was)."""
    found = {}
    for parent, _, files in os.walk(run_dir):
        for name in files:
            if name == "run.lock":  # the refused process's claim: its pid, nothing of the run
                continue
            with open(os.path.join(parent, name), "rb") as f:
                found[os.path.relpath(os.path.join(parent, name), run_dir)] = f.read()
    return found


@pytest.mark.parametrize(
    "script,written_by,where",
    [("grpo.py", "sft.py", "state.json"), ("sft.py", "grpo.py", "run.lock")],
)
def test_a_run_is_resumed_only_by_the_script_that_wrote_it(script, written_by, where, tmp_path):
    run_dir = fake_run(tmp_path / "run", state=json.dumps({"step": 1, "script": written_by}))
    (tmp_path / "run" / "args.json").write_text("{}")
    if where == "run.lock":  # a run without a checkpoint: its claim names the script
        shutil.rmtree(tmp_path / "run" / "checkpoint")
        (tmp_path / "run" / "run.lock").write_text(json.dumps({"script": written_by}))
    before = bytes_of(run_dir)
    r = run(script, "--resume", run_dir)
    one_line_error(r, f"this run was written by {written_by}, not {script}")
    assert f"`python {written_by} --resume {run_dir}`" in r.stderr
    assert bytes_of(run_dir) == before


def test_a_checkpoint_names_the_script_of_the_process_that_claimed_its_run(tmp_path):
    """grpo_ray.py's learner actors save the run its driver claimed: the script comes from the
    driver's run.lock (this test's own __main__ is pytest's: no script of its own)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.lock").write_text(json.dumps({"pid": 1, "script": "grpo_ray.py"}))

    class Model:
        def save_pretrained(self, d):
            with open(os.path.join(d, "model.safetensors"), "w") as f:
                f.write("w")

        def named_modules(self):  # no LoRA layer (lora.lora_layers)
            return iter(())

    args = argparse.Namespace(lr=0.1)
    runs.save_model_checkpoint(str(out), Model(), Model(), args, {"step": 1})
    state = common.read_json(str(out / "checkpoint" / "state.json"), "step")
    assert state["script"] == "grpo_ray.py"


BAD_STATES = [
    ({"step": -2}, "step -2, not an integer >= 0"),
    ({"step": "3"}, "step '3', not an integer >= 0"),
    ({"step": 1.5}, "step 1.5, not an integer >= 0"),
    ({"step": True}, "step True, not an integer >= 0"),
    ({"step": 1, "opt_step": -1}, "opt_step -1, not an integer >= 0"),
    ({"step": 1, "wall": "x"}, "wall 'x', not a number"),
    ({"step": 1, "wall": -1.0}, "wall -1.0, not a finite number >= 0"),
    ({"step": 1, "args": []}, "args that are not an object"),
]


@pytest.mark.parametrize("state,needle", BAD_STATES)
def test_a_bad_state_json_is_refused_before_any_file_changes(state, needle, tmp_path, capsys):
    import grpo

    run_dir = fake_run(tmp_path / "run", state=json.dumps(state))
    os.makedirs(tmp_path / "run" / "checkpoint.old")  # a leftover a resume would clear
    before = bytes_of(run_dir)
    with pytest.raises(SystemExit) as e:
        grpo.parse_args(["--resume", run_dir])
    runs.release_run_dir(run_dir)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.count("\n") == 1
    assert f"its state.json has {needle}" in err
    assert bytes_of(run_dir) == before
    assert (tmp_path / "run" / "checkpoint.old").is_dir()


BAD_ROWS = [
    (b'{"step": 0, "x": "\xff"}', "metrics.jsonl:2: not UTF-8 text (byte 0xff at column 19)"),
    (b"[0, 1]", "metrics.jsonl:2: a JSON list, not an object"),
    (b'{"loss": 1.0}', 'metrics.jsonl:2: a row without "step"'),
    (b'{"step": "1"}', "metrics.jsonl:2: step '1' is not an integer >= 0"),
    (b'{"step": -1}', "metrics.jsonl:2: step -1 is not an integer >= 0"),
    (b'{"step": false}', "metrics.jsonl:2: step False is not an integer >= 0"),
]


@pytest.mark.parametrize("row,needle", BAD_ROWS)
def test_a_bad_metrics_row_is_refused_before_any_file_changes(row, needle, tmp_path, capsys):
    import grpo

    run_dir = fake_run(tmp_path / "run")
    (tmp_path / "run" / "metrics.jsonl").write_bytes(b'{"step": 0}\n' + row + b'\n{"step": 1}\n')
    before = bytes_of(run_dir)
    with pytest.raises(SystemExit) as e:
        grpo.parse_args(["--resume", run_dir])
    runs.release_run_dir(run_dir)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.count("\n") == 1
    assert needle in err
    assert bytes_of(run_dir) == before


def test_a_non_utf8_metrics_row_is_one_line_from_the_command_line(tmp_path):
    run_dir = fake_run(tmp_path / "run", metrics='{"step": 0}\n{"step": 1}\n')
    with open(tmp_path / "run" / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 2, "note": "\xe9t\xe9"}\n{"step": 3}\n')
    one_line_error(run("sft.py", "--resume", run_dir), "metrics.jsonl:3: not UTF-8 text")


# ------------------------------------------------------------------------- a full or read-only disk
# Real filesystems: a tmpfs of a few MiB fills up, a bind mount turns a run directory read-only
# mid-run. Both need mount(2): root, as this suite runs in CI; elsewhere these tests skip.
@pytest.fixture
def mounts(tmp_path):
    """mount(kind, path, size): a small tmpfs at path ("tmpfs"), path read-only ("read-only": a
    read-only bind mount of itself), or a tmpfs resized ("resize"); all undone at teardown."""
    done = []

    def mount(kind, path, size="1m"):
        os.makedirs(path, exist_ok=True)
        if kind == "tmpfs":
            commands = [["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]]
        elif kind == "read-only":
            commands = [
                ["mount", "--bind", str(path), str(path)],
                ["mount", "-o", "remount,bind,ro", str(path)],
            ]
        else:
            commands = [["mount", "-o", f"remount,size={size}", str(path)]]
        for command in commands:
            r = subprocess.run(command, capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"{' '.join(command)}: {r.stderr.strip()} (these tests need root)")
            if command[1] in ("-t", "--bind"):
                done.append(path)
        return str(path)

    yield mount
    for path in reversed(done):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)  # (a test may have)


SAVE = """if True:
    import argparse, sys, torch, runs
    from safetensors.torch import save_file
    out, weights, optimizer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    class Model:
        def __init__(self, n):
            self.n = n
        def save_pretrained(self, d):
            save_file({"w": torch.zeros(self.n)}, d + "/model.safetensors")
        def named_modules(self):  # no LoRA layer (lora.lora_layers)
            return iter(())
    class Tokenizer:
        def save_pretrained(self, d):
            open(d + "/tokenizer.json", "w").write("{}")
    runs.claim_run_dir(out)
    args = argparse.Namespace(lr=0.1)
    runs.save_model_checkpoint(out, Model(10), Tokenizer(), args, {"step": 1})  # fits
    extra = {"optimizer.pt": {"exp_avg": torch.zeros(optimizer)}}
    runs.save_model_checkpoint(out, Model(weights), Tokenizer(), args, {"step": 2}, extra)
"""


@pytest.mark.parametrize(
    "weights,optimizer,detail",
    [
        (10**6, 10, "SafetensorError: Error while serializing: I/O error: No space left on device"),
        (10, 10**6, "RuntimeError: [enforce fail at inline_container.cc"),  # torch: no errno
    ],
)
def test_disk_full_while_saving_a_checkpoint_is_one_line(
    weights, optimizer, detail, mounts, tmp_path
):
    """4 MB into a 1 MiB tmpfs, through safetensors (model weights) or torch.save (optimizer):
    one line that says "disk full", not torch's traceback; the last checkpoint stays whole."""
    disk = mounts("tmpfs", tmp_path / "disk", size="1m")
    out = os.path.join(disk, "run")
    argv = [sys.executable, "-c", SAVE, out, str(weights), str(optimizer)]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    one_line_error(r, f"error: disk full: saving {out}/checkpoint failed ({detail}")
    assert r.returncode == 1
    assert f"free space on {disk} (" in r.stderr
    assert f"then --resume {out} continues from its last checkpoint (step 1)" in r.stderr
    assert sorted(os.listdir(out)) == ["checkpoint", "run.lock"]  # no checkpoint.tmp left
    assert common.read_json(os.path.join(out, "checkpoint", "state.json"), "step")["step"] == 1


WRITE = """if True:
    import sys, torch, runs, data
    out, how = sys.argv[1], sys.argv[2]
    runs.claim_run_dir(out)
    if how == "data":  # the scripts' own writes (args.json, rollouts/) go through data.py
        data.write_json_atomic(out + "/rollouts.json", ["x" * 1000] * 2000)
    else:
        torch.save({"x": torch.zeros(10**6)}, out + "/extra.pt")
"""


@pytest.mark.parametrize("how", ["data", "torch"])
def test_disk_full_in_a_write_of_the_scripts_own_is_one_line(how, mounts, tmp_path):
    """Outside runs.py's writers the claimed run's uncaught error is explained too (excepthook)."""
    disk = mounts("tmpfs", tmp_path / "disk", size="1m")
    out = os.path.join(disk, "run")
    argv = [sys.executable, "-c", WRITE, out, how]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    one_line_error(r, "error: disk full: writing ")
    assert f"then --resume {out} restarts it from step 0 (it has no checkpoint yet)" in r.stderr


LOG = """if True:
    import sys, runs
    out = sys.argv[1]
    runs.claim_run_dir(out, resume=True)
    runs.log_row(out, {"step": 2})
    print("logged", flush=True)
    sys.stdin.readline()  # the test makes the run directory read-only here
    runs.log_row(out, {"step": 3})
"""


def test_a_run_directory_made_read_only_mid_run_is_one_line_and_resumable(mounts, tmp_path):
    import grpo

    run_dir = fake_run(tmp_path / "run")
    argv = [sys.executable, "-c", LOG, run_dir]
    p = subprocess.Popen(
        argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout.readline() == b"logged\n"
    mounts("read-only", run_dir)
    _, err = p.communicate(b"\n", timeout=60)
    r = subprocess.CompletedProcess(argv, p.returncode, "", err.decode())
    one_line_error(r, f"error: read-only file system: appending a row to {run_dir}/metrics.jsonl")
    assert f"make {run_dir} writable again, then --resume {run_dir} continues" in r.stderr
    # writable again: the run resumes, its metrics cut back to its checkpoint's step 1
    subprocess.run(["umount", str(run_dir)], check=True)
    try:
        args = grpo.parse_args(["--resume", run_dir])
        runs.claim_run_dir(args.out, args.resume)
        runs.restore_checkpoint(args.resume, args.out)
    finally:
        runs.release_run_dir(run_dir)
    assert runs.read_metrics(os.path.join(run_dir, "metrics.jsonl")) == [{"step": 0}]


def test_a_run_a_full_disk_stopped_before_its_first_save_resumes(tiny_model_dir, mounts, tmp_path):
    """sft.py end to end on a 2 MiB tmpfs: its first checkpoint (1.6 MB of weights, 3.2 MB of AdamW
    moments) does not fit. One line, exit 1, no checkpoint. With room again, --resume restarts the
    run from step 0 with its own flags, and the checkpoint it saves names its script."""
    disk = mounts("tmpfs", tmp_path / "disk", size="2m")
    out = os.path.join(disk, "run")
    flags = ["--model", tiny_model_dir, "--countdown-n", "8", "--eval-n", "0", "--lr", "3e-3"]
    flags += ["--batch-size", "4", "--gradient-accumulation-steps", "1", "--warmup-frac", "0"]
    flags += ["--steps", "2", "--save-every", "2", "--save-dir", tmp_path / "model"]
    first = run("sft.py", *flags, "--out", out, fast=600)
    # the run got as far as saving: before the error, stderr holds transformers' progress bars
    assert first.returncode == 1
    assert "Traceback" not in first.stderr
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: disk full: saving {out}/checkpoint failed"), first.stderr
    assert first.stderr.count("error") == 1, first.stderr
    assert last.endswith(f"then --resume {out} restarts it from step 0 (it has no checkpoint yet)")
    assert not os.path.exists(os.path.join(out, "checkpoint"))
    assert [r["step"] for r in runs.read_metrics(os.path.join(out, "metrics.jsonl"))] == [1, 2]
    mounts("resize", disk, size="64m")
    resumed = run("sft.py", "--resume", out, fast=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "restarting it from step 0 with its args.json's flags" in resumed.stdout
    assert "its 2 logged rows are dropped" in resumed.stdout
    assert [r["step"] for r in runs.read_metrics(os.path.join(out, "metrics.jsonl"))] == [1, 2]
    state = common.read_json(os.path.join(out, "checkpoint", "state.json"), "step")
    assert state["step"] == 2
    assert state["script"] == "sft.py"
    assert state["args"]["lr"] == 3e-3
    assert runs.read_claim(out)["script"] == "sft.py"


# ----------------------------------------------------------------------------- CPU threads
# issue 26 (class 10): beside one other CPU-bound process on 2 cores, a GRPO step took 4.1x its
# quiet time (2.4x on one thread): OpenMP's threads wait at every op's end for the one that shares
# a core. Every script that computes with torch takes --threads N (default: torch's own choice, so
# a run computes what it did before), applies it before its engine starts and says so at start in
# one line. Elsewhere: sft.py's runtime.json records it (test_sft), every grpo_ray.py actor applies
# it (test_grpo_ray), a running vLLM engine follows it (test_grpo), bench/threads.py measures it.
@pytest.fixture
def threads_restored():
    """torch's thread count before the test (yielded), set back after it."""
    import torch

    threads = torch.get_num_threads()
    yield threads
    torch._C.set_num_threads(threads)


def start_with_threads(script, flags, model_dir, tmp_path):
    """A script in-process with `flags`, through its cheapest path that applies --threads: a dry
    run (grpo.py, the evaluators print the choice before the configuration), a one-call search on
    the tiny model (kissing.py: only a local engine has threads to set)."""
    import best_of_n
    import eval_zero_shot
    import grpo
    import kissing

    out = ["--out", str(tmp_path / "out")]
    if script == "kissing.py":
        search = ["search", "--llm", f"local:{model_dir}", "--engine", "hf", "--iters", "1"]
        search += ["--max-tokens", "8", "--out-dir", str(tmp_path / "out")]
        kissing.main(search + flags)
        return
    try:
        if script == "grpo.py":
            grpo.main(grpo.parse_args(flags + out + ["--dry-run"]))
        elif script == "eval_zero_shot.py":
            eval_zero_shot.main(flags + out + ["--dry-run"])
        else:
            best_of_n.main(flags + out + ["--dry-run"])
    except SystemExit as e:
        assert e.code == 0


THREADS_SCRIPTS = ["grpo.py", "eval_zero_shot.py", "best_of_n.py", "kissing.py"]


@pytest.mark.parametrize("script", THREADS_SCRIPTS)
def test_threads_flag_is_applied_and_printed_at_start(
    script, tiny_model_dir, threads_restored, tmp_path, capsys
):
    import torch

    n = threads_restored + 1  # not torch's choice
    start_with_threads(script, ["--threads", str(n)], tiny_model_dir, tmp_path)
    assert torch.get_num_threads() == n
    assert f"threads: {n} (--threads)" in capsys.readouterr().out.splitlines()


def test_without_threads_torch_keeps_its_choice(threads_restored, tmp_path, capsys):
    import torch

    start_with_threads("grpo.py", [], None, tmp_path)
    assert torch.get_num_threads() == threads_restored
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"threads: {threads_restored} (torch default")
    assert "--threads N to change" in lines[1]
    assert json.loads(lines[-1])["runtime"]["threads"] == threads_restored


@pytest.mark.parametrize("value", ["0", "two", "50000"])  # 50000: OpenMP crashed (issue 44)
@pytest.mark.parametrize("script", THREADS_SCRIPTS + ["sft.py", "grpo_ray.py"])
def test_a_bad_thread_count_is_one_line(script, value, capsys):
    import importlib

    module = importlib.import_module(script.removesuffix(".py"))
    argv = ["--threads", value]
    if script == "kissing.py":
        argv = ["search", "--llm", "local:m"] + argv
    with pytest.raises(SystemExit) as e:
        module.parse_args(argv)
    assert e.value.code == 2
    cpus = os.cpu_count()
    message = (
        f"error: argument --threads: {value!r} is not an integer in 1..{cpus} (this machine's "
        "CPUs) (see --help)"
    )
    assert capsys.readouterr().err.splitlines() == [message]


# ------------------------------------------------ a stop request does not outlive its test
# (CI failure: a test that ended with SIGTERM left common's "last stop" at SIGTERM, and a later
# Ctrl-C test, whose run() installs no handler, exited 143 instead of 130)
def test_a_sigterm_stop_sets_the_exit_code_143():
    runs.stop_on_sigterm()
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGTERM)
    assert runs.stop_exit_code() == 143


def test_the_next_test_starts_from_ctrl_c_with_the_old_handlers():
    """Runs after the test above (pytest keeps file order)."""
    assert runs.stop_exit_code() == 130
    assert signal.getsignal(signal.SIGTERM) is not signal.getsignal(signal.SIGINT)


@pytest.mark.parametrize("script", ["grpo.py", "sft.py", "expert_iteration.py"])
@pytest.mark.parametrize(
    "flag,device,needle",
    [
        ("--policy-device", "bogus", "not a device; pass cpu, cuda or cuda:N"),
        ("--vllm-device", "bogus", "not a device; pass cpu, cuda or cuda:N"),
        ("--policy-device", "mps", "pass cpu, cuda or cuda:N"),
    ],
)
def test_a_bad_device_is_one_line_before_loading(script, flag, device, needle, capsys):
    """Issue 44: these were tracebacks once the model loaded (torch's device parser, or "Torch not
    compiled with CUDA enabled")."""
    import importlib

    module = importlib.import_module(script.removesuffix(".py"))
    with pytest.raises(SystemExit):
        module.parse_args([flag, device, "--dry-run"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} {device}: {needle}" in err, err


@pytest.mark.skipif(
    __import__("torch").backends.cuda.is_built(), reason="a CUDA build of torch is installed"
)
def test_cuda_on_a_cpu_only_torch_is_one_line(capsys):
    import grpo

    for device in ("cuda", "cuda:0"):
        with pytest.raises(SystemExit):
            grpo.parse_args(["--policy-device", device, "--dry-run"])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "this torch is built without CUDA" in err, err


def test_a_truncated_or_replaced_checkpoint_file_is_one_line(tiny_model_dir, tmp_path, capsys):
    """Issue 44: only missing files were checked, so a truncated model.safetensors or another
    model's optimizer.pt was a traceback once loading began. A save records each file's size and
    a hash of its head and tail; a resume checks them before anything loads."""
    import argparse
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import grpo

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.lock").write_text("")
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    args = argparse.Namespace(model=tiny_model_dir, lora_rank=0)
    extra = {"optimizer.pt": {"state": {0: torch.ones(4)}}, "scheduler.pt": {}}
    ckpt = runs.save_model_checkpoint(str(run_dir), model, tokenizer, args, {"step": 1}, extra)
    good = tmp_path / "good"
    shutil.copytree(ckpt, good)
    capsys.readouterr()  # the loading and saving bars
    weights = os.path.join(ckpt, "model.safetensors")
    size = os.path.getsize(weights)
    with open(weights, "r+b") as f:
        f.truncate(size // 2)
    optimizer = os.path.join(ckpt, "optimizer.pt")
    for damage, needle in (
        (None, f"model.safetensors has {size // 2} bytes, the save wrote {size}"),
        ("optimizer", "optimizer.pt is not the file the save wrote (its content differs)"),
    ):
        if damage == "optimizer":  # the weights back, another model's optimizer state instead
            shutil.copy2(good / "model.safetensors", weights)
            torch.save({"state": {0: torch.zeros(4)}}, optimizer)
        with pytest.raises(SystemExit):
            grpo.parse_args(["--resume", str(run_dir)])
        runs.release_run_dir(str(run_dir))
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
    shutil.copy2(good / "optimizer.pt", optimizer)
    grpo.parse_args(["--resume", str(run_dir), "--dry-run"])  # whole again: accepted


# ------------------------------------------- data.py, convert_lm.py and eval's --out on a bad disk
# issue 44: a tool's output on a full, read-only or size-limited disk is one line and leaves no
# partial file or model directory; a script without --resume is told to run it again.
@pytest.fixture(scope="module")
def student_files(tmp_path_factory):
    """convert_lm.py's inputs: test_convert's random model (~0.6 MB of weights) and its BPE."""
    import test_convert as tc

    d = tmp_path_factory.mktemp("student")
    vocab, merges = tc.train_bpe(tc.sample_strings(150, seed=1), n_merges=150)
    tc.write_student(d, vocab, merges, tc.random_state_dict(**tc.SIZES))
    argv = ["--checkpoint", str(d / "ckpt.pt"), "--vocab", str(d / "vocab.json")]
    return argv + ["--merges", str(d / "merges.txt"), "--num-heads", "2"]


def last_line_error(r, needle):
    """One_line_error for a run that got as far as saving: transformers' progress bar may come
    first on stderr; then one `error:` line, the last."""
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.replace("\r", "\n").strip().splitlines()
    assert [x for x in lines if x.startswith("error")] == [lines[-1]], r.stderr
    assert lines[-1].startswith(f"error: {needle}"), r.stderr


def test_convert_lm_on_a_full_disk_is_one_line_and_leaves_no_model(student_files, mounts, tmp_path):
    disk = mounts("tmpfs", tmp_path / "disk", size="256k")
    out = os.path.join(disk, "lm")
    r = run("convert_lm.py", *student_files, "--out", out, fast=60)
    last_line_error(r, f"disk full: saving {out} failed (")
    assert f"free space on {disk} (" in r.stderr and r.stderr.strip().endswith("run it again")
    assert os.listdir(disk) == []  # no .lm.tmp<pid>, no lm


def test_convert_lm_and_data_py_to_a_read_only_folder_are_one_line_first(mounts, tmp_path):
    folder = mounts("read-only", tmp_path / "ro")
    argv = ["--checkpoint", __file__, "--vocab", __file__, "--out", f"{folder}/lm"]
    one_line_error(run("convert_lm.py", *argv, fast=10), f"read-only file system ({folder})")
    r = run("data.py", "countdown", "--n", "5", "--out", f"{folder}/cd.jsonl", fast=10)
    one_line_error(r, f"error: --out {folder}/cd.jsonl: read-only file system ({folder})")


def test_data_py_on_a_full_disk_is_one_line_and_leaves_no_file(mounts, tmp_path):
    disk = mounts("tmpfs", tmp_path / "disk", size="64k")
    out = os.path.join(disk, "cd.jsonl")
    r = run("data.py", "countdown", "--n", "3000", "--out", out, fast=60)
    one_line_error(r, f"error: disk full: writing {out} failed (No space left on device); free")
    assert r.returncode == 1 and os.listdir(disk) == []


def limited(limit):
    """A child process's file-size limit (RLIMIT_FSIZE, bytes), SIGXFSZ ignored so that a write
    past it fails with EFBIG instead of killing the process."""

    def start():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return start


@pytest.mark.parametrize("script", ["data.py", "convert_lm.py"])
def test_a_file_size_limit_is_one_line_naming_it(script, student_files, tmp_path):
    if script == "data.py":
        out = str(tmp_path / "cd.jsonl")
        argv = ["data.py", "countdown", "--n", "3000", "--out", out]
        needle = f"file too large: writing {out} failed (File too large); raise"
    else:
        out = str(tmp_path / "lm")
        argv = ["convert_lm.py", *student_files, "--out", out]
        needle = f"file too large: saving {out} failed ("
    r = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limited(64 * 1024),
    )
    last_line_error(r, needle)
    assert "raise the file-size limit (ulimit -f 64)" in r.stderr
    assert os.listdir(tmp_path) == []


CLAIM_OUT = """if True:
    import sys, data, eval_zero_shot
    out = sys.argv[1]
    eval_zero_shot.claim_out(out)  # best_of_n.py claims its --out with this function too
    data.write_json_atomic(out + "/summary.json", ["x" * 1000] * 2000)
"""


def test_a_full_disk_under_an_eval_out_advises_no_resume(mounts, tmp_path):
    """eval_zero_shot.py and best_of_n.py have no --resume: the line says run it again."""
    disk = mounts("tmpfs", tmp_path / "disk", size="1m")
    out = os.path.join(disk, "eval")
    argv = [sys.executable, "-c", CLAIM_OUT, out]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    one_line_error(r, "error: disk full: writing ")
    assert "--resume" not in r.stderr
    assert r.stderr.strip().endswith(
        "then run it again (with --overwrite if --out holds results it wrote)"
    )
