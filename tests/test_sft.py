"""sft.py on the tiny fixture models.

The loss goes down, gradient accumulation is exact, fp32 master weights keep small updates, Ctrl-C
and SIGTERM save and --resume continues with the run's own flags, bad input is refused in one line
before a model loads, --save-dir never deletes what sft.py did not write (and a kill mid-swap
recovers), --dry-run, --sleep-engine's call order, the tiny-model builder's families (tokenizers
that survive a reload, vLLM = HF), the CLI end to end with --engine hf, checkpoints in vLLM, and
the shipped models/countdown-tiny.
"""

import json
import os
import random
import re
import shutil
import signal

import pytest
import torch
import transformers

import plot
import rollout
import runs
import sft
from conftest import ROOT, requires_vllm, run_script
from data import load_task
from grader import countdown_reward_fn

SHIPPED = os.path.join(ROOT, "models", "countdown-tiny")


@pytest.fixture(scope="module")
def sft_jsonl(tmp_path_factory):
    """8 Countdown SFT pairs in r1_zero format, written the way users hand sft.py a dataset."""
    problems = load_task("countdown", "train", path="synthetic", limit=8, seed=0, prompt="r1_zero")
    lines = []
    for r in problems:
        pair = {"prompt": r["prompt"], "response": sft.countdown_trace(**r["ground_truth"])}
        lines.append(json.dumps(pair) + "\n")
    path = tmp_path_factory.mktemp("sftdata") / "sft.jsonl"
    path.write_text("".join(lines))
    return str(path)


def flags(model, data, out, *extra):
    """A short run's flags: no validation, a high lr, 4 pairs a step, a checkpoint every 2."""
    run = ["--model", model, "--data", data, "--out", str(out), "--eval-n", "0"]
    optimisation = ["--lr", "3e-3", "--batch-size", "4", "--gradient-accumulation-steps", "1"]
    schedule = ["--warmup-frac", "0", "--save-every", "2"]
    return run + optimisation + schedule + [str(x) for x in extra]


def train_rows(history):
    return [r for r in history if "train/loss" in r]


def stopped(argv):
    """What sft.main(argv) ended with (an escaping KeyboardInterrupt would end the session)."""
    try:
        sft.main(argv)
    except BaseException as e:
        return e
    return None


def test_countdown_trace_is_correct_and_graded_correct():
    rng = random.Random(0)
    gave_up = 0
    for r in load_task("countdown", split="train", path="synthetic", limit=300, seed=1):
        gt = r["ground_truth"]
        resp = sft.countdown_trace(gt["numbers"], gt["target"], give_up=0.5, rng=rng)
        attempts = resp.split(" </think>")[0].strip().split(". ")
        # each attempt is "x o y = v, v o z = w vs target yes|no": true arithmetic, a true verdict
        for k, a in enumerate(attempts):
            first, second = a.rstrip(".").split(", ")
            second, restated, verdict = re.fullmatch(r"(.*) vs (\d+) (yes|no)", second).groups()
            assert int(restated) == gt["target"], a
            for step in (first, second):
                lhs, rhs = step.rsplit(" = ", 1)
                assert eval(lhs) == int(rhs), step
            hit = int(second.rsplit(" = ", 1)[1]) == gt["target"]
            assert (verdict == "yes") == hit, a
            assert verdict == "no" or k == len(attempts) - 1, "the search stops at its first hit"
        reward = countdown_reward_fn("<think>" + resp, gt)["reward"]
        if attempts[-1].endswith("no."):  # gave up after the first miss: a formatted wrong answer
            gave_up += 1
            assert len(attempts) == 1 and reward == 0.1, resp
        else:
            assert reward == 1.0, resp
    assert 100 < gave_up < 150, "about half of the traces that miss first give up (give_up=0.5)"
    with pytest.raises(ValueError):
        sft.countdown_trace([1, 1, 1], 47)


def test_loss_decreases_and_run_dir_layout(tiny_model_dir, sft_jsonl, tmp_path):
    hist = sft.main(flags(tiny_model_dir, sft_jsonl, tmp_path, "--n-examples", "4", "--steps", "6"))
    train = train_rows(hist)
    # "step" = optimizer steps done, on every row
    assert [r["step"] for r in train] == list(range(1, 7))
    assert train[-1]["train/nll_per_token"] < 0.8 * train[0]["train/nll_per_token"]
    for k in ("train/grad_norm", "train/entropy", "train/lr", "train/tokens_per_s", "time/step"):
        assert all(r[k] >= 0 for r in train), k
    saved = json.load(open(tmp_path / "args.json"))  # written at start: vars(args), resolved
    assert saved["gradient_accumulation_steps"] == 1
    assert saved["eval_max_tokens"] == 2048
    assert saved["steps"] == 6
    # what the model allowed, apart from the flags (no --shared-prefix here)
    runtime = json.load(open(tmp_path / "runtime.json"))
    assert runtime == {"shared_prefix": False, "threads": torch.get_num_threads()}
    assert os.path.exists(tmp_path / "dashboard.png")
    assert os.path.exists(tmp_path / "model" / "state.json")
    assert json.load(open(tmp_path / "checkpoint" / "state.json"))["step"] == 6


def test_threads_flag_is_applied_at_start_and_recorded(tiny_model_dir, sft_jsonl, tmp_path, capsys):
    """--threads: set before anything computes (a validation engine would make torch's own setter
    a no-op), printed in one line at start, recorded in runtime.json."""
    before = torch.get_num_threads()
    want = before + 1  # not torch's choice
    try:
        sft.main(flags(tiny_model_dir, sft_jsonl, tmp_path, "--steps", "1", "--threads", want))
        inside = torch.get_num_threads()
    finally:
        torch._C.set_num_threads(before)
    assert inside == want
    assert json.load(open(tmp_path / "runtime.json"))["threads"] == want
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"threads: {want} (--threads)"


def test_grad_accum_equals_one_big_batch_and_old_spellings(tiny_model_dir, sft_jsonl, tmp_path):
    one_argv = flags(tiny_model_dir, sft_jsonl, tmp_path / "a", "--steps", "2", "--batch-size", "8")
    one = train_rows(sft.main(one_argv))
    # --grad-accum and --clip: aliases of the grpo.py names
    four_argv = flags(
        tiny_model_dir, sft_jsonl, tmp_path / "b", "--steps", "2", "--batch-size", "8"
    )
    four_argv += ["--grad-accum", "4", "--clip", "1.0"]
    four = train_rows(sft.main(four_argv))
    for a, b in zip(one, four):  # same loss and gradient norm, before and after one optimizer step
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)


def test_shared_prefix_gives_the_same_steps(tiny_model_dir, sft_jsonl, tmp_path):
    """--shared-prefix (the microbatch's common template prefix run once:
    losses.get_response_log_probs(prefix_len)) changes no number: the same loss, grad norm and
    entropy, step after step."""
    runs = {}
    for name, extra in (("on", ["--shared-prefix"]), ("off", [])):
        argv = flags(
            tiny_model_dir, sft_jsonl, tmp_path / name, "--steps", "2", "--batch-size", "4"
        )
        runs[name] = train_rows(sft.main(argv + extra))
    # the tiny model's cache passes the check: the runs did differ in the prefix pass
    assert json.load(open(tmp_path / "on" / "runtime.json"))["shared_prefix"] is True
    for a, b in zip(runs["on"], runs["off"]):
        for k in ("train/loss", "train/grad_norm", "train/entropy", "train/nll_per_token"):
            assert a[k] == pytest.approx(b[k], rel=1e-5), k


def test_fp32_master_weights_keep_small_updates_in_bf16(tiny_model_dir, sft_jsonl, tmp_path):
    """One AdamW step at lr 1e-5 from bf16 weights, bf16 compute: fp32 masters move >= 95% of the
    weights; pure bf16 rounds most updates away (|update| = lr < half a bf16 step for
    |w| >~ 0.004)."""
    start = tmp_path / "bf16"
    bf16 = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).to(torch.bfloat16)
    bf16.save_pretrained(start)
    transformers.AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(start)
    before = transformers.AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    before = before.state_dict()
    n_weights = sum(v.numel() for v in before.values())
    changed = {}  # 0 (fp32 masters) or 1 (--pure-bf16) -> share of the weights that moved
    for mode in ([], ["--pure-bf16"]):
        out = tmp_path / f"run{len(mode)}"
        argv = flags(str(start), sft_jsonl, out, "--steps", "1", "--lr", "1e-5")
        sft.main(argv + ["--dtype", "bfloat16"] + mode)
        after = transformers.AutoModelForCausalLM.from_pretrained(
            out / "model", dtype=torch.float32
        )
        after = after.state_dict()
        moved = sum(int((after[k] != before[k]).sum()) for k in before)
        changed[len(mode)] = moved / n_weights
    assert json.load(open(tmp_path / "run0" / "args.json"))["param_dtype"] == "float32"
    assert changed[0] >= 0.95, changed
    assert changed[1] < 0.5, changed  # the failure fp32 masters fix, measured


def test_ctrl_c_saves_a_consistent_checkpoint_and_resume_restores_the_flags(
    tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, capsys, ctrl_c
):
    full_argv = flags(
        tiny_model_dir, sft_jsonl, tmp_path / "full", "--steps", "4", "--save-every", "0"
    )
    full = train_rows(sft.main(full_argv))
    real = sft.sft_microbatch_train_step
    calls = []

    def ctrl_c_in_step_2(*a, **kw):
        # a real SIGINT in the middle of the second optimizer step (one microbatch each)
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)
        return real(*a, **kw)

    monkeypatch.setattr(sft, "sft_microbatch_train_step", ctrl_c_in_step_2)
    cut = tmp_path / "cut"
    stop = None
    try:
        sft.main(flags(tiny_model_dir, sft_jsonl, cut, "--steps", "4", "--save-every", "0"))
    except BaseException as e:  # caught here: an escaping KeyboardInterrupt would end the session
        stop = e
    assert isinstance(stop, SystemExit) and stop.code == 130, repr(stop)
    assert "interrupted after step 2" in capsys.readouterr().out
    # the step finished, then was saved
    assert json.load(open(cut / "checkpoint" / "state.json"))["step"] == 2
    monkeypatch.setattr(sft, "sft_microbatch_train_step", real)
    # lr, batch size, steps... from the run's args.json
    resumed = train_rows(sft.main(["--resume", str(cut)]))
    assert "resume: restored the run's flags" in capsys.readouterr().out
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(full, resumed):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)
        assert a["train/lr"] == pytest.approx(b["train/lr"])
    # a flag given again overrides
    more = train_rows(sft.main(["--resume", str(cut / "checkpoint"), "--steps", "5"]))
    assert "overriding steps 4 -> 5" in capsys.readouterr().out
    assert more[-1]["step"] == 5


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_second_signal_mid_step_aborts_in_one_line_without_saving(
    sig, tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, ctrl_c, sigterm
):
    real = sft.sft_microbatch_train_step

    def two_signals(*a, **kw):  # the first is deferred to the step's end, the second aborts
        signal.raise_signal(sig)
        signal.raise_signal(sig)
        return real(*a, **kw)

    monkeypatch.setattr(sft, "sft_microbatch_train_step", two_signals)
    stop = None
    try:
        sft.main(
            flags(tiny_model_dir, sft_jsonl, tmp_path / "cut", "--steps", "2", "--save-every", "0")
        )
    except BaseException as e:  # an escaping KeyboardInterrupt would end the pytest session
        stop = e
    assert isinstance(stop, SystemExit)
    assert str(stop.code).strip().startswith("aborted inside step 1: nothing saved")
    assert not (tmp_path / "cut" / "checkpoint").exists()


def test_sigterm_saves_like_ctrl_c_and_exits_143(
    tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, capsys, sigterm
):
    """SIGTERM (schedulers, `timeout`, container stops) between steps: the checkpoint is saved and
    the exit code is 143. One during the final save lets it finish: the model directory is
    complete."""
    real_save = sft.save_checkpoint
    calls = []

    def sigterm_at_the_second_save(*a, **kw):  # after step 2, outside the step's deferral
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGTERM)
        return real_save(*a, **kw)

    monkeypatch.setattr(sft, "save_checkpoint", sigterm_at_the_second_save)
    cut = tmp_path / "cut"
    stop = stopped(flags(tiny_model_dir, sft_jsonl, cut, "--steps", "3", "--save-every", "1"))
    assert isinstance(stop, SystemExit) and stop.code == 143, repr(stop)
    assert "SIGTERM: interrupted after step 2" in capsys.readouterr().out
    assert json.load(open(cut / "checkpoint" / "state.json"))["step"] == 2
    monkeypatch.setattr(sft, "save_checkpoint", real_save)

    real_swap = runs.save_checkpoint

    def sigterm_in_the_final_save(out_dir, write, **kw):
        if kw.get("name") == "model":
            signal.raise_signal(signal.SIGTERM)
        return real_swap(out_dir, write, **kw)

    monkeypatch.setattr(runs, "save_checkpoint", sigterm_in_the_final_save)
    stop = stopped(["--resume", str(cut)])
    assert isinstance(stop, SystemExit) and stop.code == 143, repr(stop)
    assert "SIGTERM: stopped after the final save" in capsys.readouterr().out
    assert sft.save_complete(cut / "model")
    assert json.load(open(cut / "model" / "state.json"))["step"] == 3


def eval_flags(model, data, out, *extra):
    """flags() with a validation after every step through the HF engine (2 problems, 4 tokens)."""
    argv = flags(model, data, out, "--save-every", "0", "--eval-every", "1", *extra)
    argv += ["--eval-task", "countdown", "--eval-path", "synthetic", "--eval-n", "2"]
    return argv + ["--eval-max-tokens", "4", "--engine", "hf"]


def eval_rows(out):
    rows = runs.read_metrics(os.path.join(out, "metrics.jsonl"))
    keys = ("step", "eval_step", "eval/format_reward", "eval/response_len")
    return [tuple(r[k] for k in keys) for r in rows if "eval_step" in r]


def test_a_stop_in_a_step_that_ends_in_an_eval_resumes_with_that_eval(
    tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, ctrl_c
):
    """Ctrl-C inside a step whose end is due a validation (mid-run, and the last step): the step
    finishes and is saved, the validation is skipped, and --resume runs it first: the eval rows
    equal a straight run's."""
    sft.main(eval_flags(tiny_model_dir, sft_jsonl, tmp_path / "straight", "--steps", "2"))
    real = sft.sft_microbatch_train_step
    for cut in (1, 2):
        calls = []

        def ctrl_c_in_the_cut_step(*a, calls=calls, cut=cut, **kw):  # one microbatch a step
            calls.append(1)
            if len(calls) == cut:
                signal.raise_signal(signal.SIGINT)
            return real(*a, **kw)

        monkeypatch.setattr(sft, "sft_microbatch_train_step", ctrl_c_in_the_cut_step)
        out = tmp_path / f"cut{cut}"
        stop = stopped(eval_flags(tiny_model_dir, sft_jsonl, out, "--steps", "2"))
        assert isinstance(stop, SystemExit) and stop.code == 130, repr(stop)
        # step 0's (before training), then the cut step's: skipped
        assert [r[0] for r in eval_rows(out)] == list(range(0, cut))
        monkeypatch.setattr(sft, "sft_microbatch_train_step", real)
        sft.main(["--resume", str(out)])
        assert eval_rows(out) == eval_rows(tmp_path / "straight"), cut
        assert os.path.exists(out / "rollouts" / f"step_{cut:04d}.jsonl")


def test_lr_and_weight_decay_given_with_resume_take_effect(tiny_model_dir, sft_jsonl, tmp_path):
    """--resume RUN --lr X: the restored AdamW state carries the old lr and weight decay; the
    flags win (constant schedule here: --min-lr-frac 1, no warmup)."""
    out = tmp_path / "run"
    sft.main(flags(tiny_model_dir, sft_jsonl, out, "--steps", "1", "--min-lr-frac", "1"))
    rows = sft.main(["--resume", str(out), "--steps", "2", "--lr", "1e-3", "--weight-decay", "0.1"])
    assert [r["train/lr"] for r in train_rows(rows)] == [pytest.approx(3e-3), pytest.approx(1e-3)]
    group = torch.load(out / "checkpoint" / "optimizer.pt")["param_groups"][0]
    assert group["lr"] == pytest.approx(1e-3) and group["initial_lr"] == pytest.approx(1e-3)
    assert group["weight_decay"] == pytest.approx(0.1)


def test_a_copied_run_saves_into_its_own_directory(tiny_model_dir, sft_jsonl, tmp_path, capsys):
    """cp -a RUN COPY; --resume COPY: the saved --save-dir was RUN's own <out>/model, so COPY's
    final model goes to COPY/model and RUN's stays as it was; --save-dir given now wins."""
    run = tmp_path / "run"
    sft.main(flags(tiny_model_dir, sft_jsonl, run, "--steps", "1"))
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, symlinks=True)
    sft.main(["--resume", str(copy), "--steps", "2"])
    assert json.load(open(run / "model" / "state.json"))["step"] == 1
    assert json.load(open(copy / "model" / "state.json"))["step"] == 2
    assert "is a copy of the run saved in" in capsys.readouterr().out
    named = tmp_path / "named"
    sft.main(["--resume", str(copy), "--steps", "3", "--save-dir", str(named)])
    assert json.load(open(named / "state.json"))["step"] == 3
    assert json.load(open(copy / "model" / "state.json"))["step"] == 2


@pytest.mark.parametrize("where", ["entering the final save", "in the closing plot"])
def test_sigterm_around_the_final_save_is_one_line_and_143(
    where, tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, capsys, sigterm
):
    """SIGTERM just before the final save's deferral begins, or while the closing dashboard is
    drawn: exit 143 with one line, no traceback; the run resumes to a complete model."""
    real_defer = runs.finish_then_interrupt
    real_plot = plot.plot_runs

    def sigterm_entering(what="this step"):
        if what == "the final save":
            signal.raise_signal(signal.SIGTERM)
        return real_defer(what)

    def sigterm_plotting(*a, **kw):
        signal.raise_signal(signal.SIGTERM)
        return real_plot(*a, **kw)

    if where == "entering the final save":
        monkeypatch.setattr(runs, "finish_then_interrupt", sigterm_entering)
    else:
        monkeypatch.setattr(plot, "plot_runs", sigterm_plotting)
    out = tmp_path / "run"
    stop = stopped(flags(tiny_model_dir, sft_jsonl, out, "--steps", "1"))
    assert isinstance(stop, SystemExit) and stop.code == 143, repr(stop)
    said = capsys.readouterr().out
    if where == "entering the final save":
        assert "SIGTERM: stopped before the final save; --resume" in said
        assert not (out / "model").exists()
    else:
        assert "SIGTERM: stopped after the final save" in said
        assert os.path.exists(out / "dashboard.png")
    assert not [n for n in os.listdir(out) if ".tmp" in n]
    monkeypatch.undo()
    sft.main(["--resume", str(out)])
    assert json.load(open(out / "model" / "state.json"))["step"] == 1


def test_ctrl_c_while_the_engine_starts_is_one_line_and_resumable(
    tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, capsys, ctrl_c
):
    real = rollout.init_engine

    def ctrl_c_starting(*a, **kw):
        signal.raise_signal(signal.SIGINT)
        return real(*a, **kw)

    monkeypatch.setattr(rollout, "init_engine", ctrl_c_starting)
    out = tmp_path / "run"
    stop = stopped(eval_flags(tiny_model_dir, sft_jsonl, out, "--steps", "1"))
    assert isinstance(stop, SystemExit) and stop.code == 130, repr(stop)
    assert f"Ctrl-C: stopped while starting (no step ran); continue with --resume {out}" in (
        capsys.readouterr().out
    )
    monkeypatch.setattr(rollout, "init_engine", real)
    sft.main(["--resume", str(out)])
    assert [r[:2] for r in eval_rows(out)] == [(0, 1), (1, 2)]  # before training, then step 1
    assert json.load(open(out / "model" / "state.json"))["step"] == 1


@pytest.mark.parametrize(
    "save,needle",
    [
        ("FOLDER", "FOLDER holds files sft.py did not write (notes.txt); pass a new or empty"),
        ("OUT", "overlaps --out"),  # equal: its metrics, args and checkpoint were deleted
        ("OUT/checkpoint", "overlaps --out"),
        ("TMP", "overlaps --out"),  # holds --out
        (".", "--save-dir .: the current directory or one holding it"),
        ("NEW", "NEW.old is not an sft.py save"),  # the swap would replace it
        ("FILE", "FILE is a file"),
    ],
    ids=["folder", "out", "in-out", "holds-out", "cwd", "old", "file"],
)
def test_a_save_dir_holding_anything_else_is_refused_before_training(
    save, needle, tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, capsys
):
    def no_loading(*a, **kw):
        raise AssertionError("a model was loaded before the bad --save-dir was refused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    mine = {
        "FOLDER/notes.txt": "a user's file",
        "FOLDER/MODEL_CARD.md": "# card\n",
        "NEW.old/weights.bin": "not sft.py's",
        "FILE": "a file",
    }
    for name, text in mine.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    path = save
    if save.startswith("OUT"):
        path = str(tmp_path / "out") + save[3:]
    elif save == "TMP":
        path = str(tmp_path)
    elif save != ".":
        path = str(tmp_path / save)
    argv = flags(tiny_model_dir, sft_jsonl, tmp_path / "out", "--steps", "1", "--save-dir", path)
    with pytest.raises(SystemExit) as e:
        sft.main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2, err
    assert err.startswith("error: ") and "\n" not in err and needle in err, err
    for name, text in mine.items():
        assert (tmp_path / name).read_text() == text, name
    marked = [m for m in runs.RUN_MARKERS if os.path.exists(tmp_path / "out" / m)]
    assert not marked, "the fixed command may reuse --out"


def test_save_dir_keeps_the_model_card_and_replaces_only_its_own_save(
    tiny_model_dir, sft_jsonl, tmp_path, capsys
):
    """The README's recipe saves into models/countdown-tiny: the shipped directory carries
    sft.SAVE_MARKER (an earlier sft.py wrote it), so a save may replace it; its model card stays and
    the old layout's sft_args.json goes. A directory holding only a model card is accepted too; one
    with anything else added is refused."""
    recipe = ["--init-config", "tiny", "--data", "countdown", "--out", str(tmp_path / "r")]
    assert dry(recipe + ["--save-dir", SHIPPED], capsys)["save_dir"] == SHIPPED
    shipped = tmp_path / "countdown-tiny"
    shutil.copytree(SHIPPED, shipped)
    card = (shipped / "MODEL_CARD.md").read_text()
    run = flags(tiny_model_dir, sft_jsonl, tmp_path / "run", "--steps", "1", "--save-dir", shipped)
    sft.main(run)
    assert (shipped / "MODEL_CARD.md").read_text() == card
    marker = json.load(open(shipped / sft.SAVE_MARKER))
    assert marker["written_by"] == "sft.py"
    assert "state.json" in marker["files"]
    assert "sft_args.json" not in marker["files"]
    assert sorted(os.listdir(shipped)) == sorted(
        marker["files"] + ["MODEL_CARD.md", sft.SAVE_MARKER]
    )
    # the tiny qwen2 now, not the shipped llama
    assert json.load(open(shipped / "config.json"))["model_type"] == "qwen2"
    assert not os.path.exists(str(shipped) + ".tmp")
    assert not os.path.exists(str(shipped) + ".old")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "README.md").write_text("# my model\n")
    assert dry(recipe + ["--save-dir", str(fresh)], capsys)["save_dir"] == str(fresh)
    (shipped / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as e:
        sft.parse_args(recipe + ["--save-dir", str(shipped), "--dry-run"])
    assert e.value.code == 2
    assert "holds files sft.py did not write (notes.txt)" in capsys.readouterr().err


class Killed(BaseException):
    """The process dying at this exact point, as under SIGKILL (a fault-injection seam)."""


def test_a_kill_between_the_final_swaps_renames_is_recovered_with_the_model_card(
    tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, capsys
):
    save = tmp_path / "model-x"
    save.mkdir()
    (save / "MODEL_CARD.md").write_text("# hand-written card\n")
    real_replace = os.replace

    def killed_between_the_renames(src, dst):  # <save>.old is in place; <save>.tmp is not moved
        if str(src) == f"{save}.tmp":
            raise Killed
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_between_the_renames)
    out = tmp_path / "run"
    stop = stopped(flags(tiny_model_dir, sft_jsonl, out, "--steps", "1", "--save-dir", save))
    monkeypatch.setattr(os, "replace", real_replace)
    assert isinstance(stop, Killed), repr(stop)
    assert not save.exists()
    assert os.path.isdir(f"{save}.tmp") and os.path.isdir(f"{save}.old")
    capsys.readouterr()
    sft.main(["--resume", str(out)])
    assert "recovered" in capsys.readouterr().out
    assert (save / "MODEL_CARD.md").read_text() == "# hand-written card\n"
    assert sft.save_complete(save)
    assert not os.path.exists(f"{save}.tmp")
    assert not os.path.exists(f"{save}.old")


@pytest.mark.parametrize(
    "kill",
    ["tmp made", "tmp marker half-written", "claim half-written"],
)
def test_a_kill_at_each_point_of_the_final_save_is_recovered(
    kill, tiny_model_dir, sft_jsonl, tmp_path, capsys
):
    """kill -9 in save_model leaves the directories as below (made here by hand: a real kill runs
    no cleanup); --resume is not refused, finishes the save and leaves no <save-dir>.tmp / .old.
    tmp made: runs.save_checkpoint created <save-dir>.tmp, the marker not yet in it. tmp marker
    half-written: data.write_json_atomic's temp file of the marker is all it holds. claim
    half-written: the same in <save-dir>, a directory with only a model card."""
    save = tmp_path / "model-x"
    out = tmp_path / "run"
    sft.main(flags(tiny_model_dir, sft_jsonl, out, "--steps", "1", "--save-dir", save))
    if kill == "claim half-written":
        shutil.rmtree(save)
        save.mkdir()
        (save / "MODEL_CARD.md").write_text("# card\n")
        (save / f"{sft.SAVE_MARKER}.tmp4242").write_text('{"written_by": "sf')
    else:
        os.mkdir(f"{save}.tmp")
    if kill == "tmp marker half-written":
        with open(os.path.join(f"{save}.tmp", f"{sft.SAVE_MARKER}.tmp4242"), "w") as f:
            f.write('{"written_by": "sf')
    sft.main(["--resume", str(out), "--steps", "2"])
    assert sft.save_complete(save)
    assert json.load(open(save / "state.json"))["step"] == 2
    assert not os.path.exists(f"{save}.tmp") and not os.path.exists(f"{save}.old")
    assert not [n for n in os.listdir(save) if n.startswith(f"{sft.SAVE_MARKER}.tmp")]


def test_shared_prefix_falls_back_where_the_models_cache_fails_its_check(
    tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, capsys
):
    # the verdict losses' self-check would give
    monkeypatch.setattr(sft, "shared_prefix_works", lambda model: False)
    argv = flags(tiny_model_dir, sft_jsonl, tmp_path, "--steps", "1", "--shared-prefix")
    assert train_rows(sft.main(argv))
    assert "notice: --shared-prefix off" in capsys.readouterr().out
    # the flag stays as given; the runtime record says what ran
    assert json.load(open(tmp_path / "args.json"))["shared_prefix"] is True
    assert json.load(open(tmp_path / "runtime.json"))["shared_prefix"] is False


def test_reusing_out_without_resume_is_refused(tiny_model_dir, sft_jsonl, tmp_path, capsys):
    sft.main(flags(tiny_model_dir, sft_jsonl, tmp_path, "--steps", "1"))
    before = open(tmp_path / "metrics.jsonl").read()
    with pytest.raises(SystemExit):
        sft.main(flags(tiny_model_dir, sft_jsonl, tmp_path, "--steps", "1"))
    assert "already holds a run" in capsys.readouterr().err
    assert open(tmp_path / "metrics.jsonl").read() == before


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--batch-size", "0"], "--batch-size: '0' is not an integer > 0"),
        (["--max-seq-len", "0"], "--max-seq-len: '0' is not an integer > 0"),
        (["--gradient-accumulation-steps", "3"], "multiple of --gradient-accumulation-steps 3"),
        (["--max-grad-norm", "-1"], "--clip: '-1' is not a finite number > 0"),
        (["--data", "MISSING"], "MISSING: no such file"),
        (["--data", "synthetic"], "--data synthetic: no such file"),
        (["--data", "EMPTY"], "an empty one"),
        (["--data", "BLANK"], "no pairs"),
        (["--model", "NOTMODEL"], "no config.json there"),
        # no "--batch-size 0" advice
        (["--max-seq-len", "5"], "only 0 pairs fit --max-seq-len 5: raise it to at least"),
        (["--n-examples", "lots"], "--n-examples lots"),
        (["--n-examples", "99"], "the data has 8 pairs"),
        (["--n-examples", "2"], "--n-examples 2 is fewer than --batch-size 4"),
        (["--eval-task", "gsm8k", "--eval-n", "4"], "python data.py prepare gsm8k --from"),
        (["--pure-bf16"], "--pure-bf16 needs bf16 compute"),
        (
            ["--sleep-engine", "--vllm-device", "cpu:1"],
            "--sleep-engine is for an engine that shares",
        ),
        (["--wandb", "proj"], "--wandb needs the wandb package"),
        (["--attn-implementation", "flash_attention_2"], "needs the flash-attn package"),
    ],
)
def test_bad_values_refused_in_one_line_before_a_model_loads(
    extra, needle, tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, capsys
):
    def no_loading(*a, **kw):
        raise AssertionError("a model was loaded before the bad value was refused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    (tmp_path / "EMPTY").write_text("")
    (tmp_path / "BLANK").write_text("\n\n")
    (tmp_path / "NOTMODEL").mkdir()
    placeholders = ("MISSING", "EMPTY", "BLANK", "NOTMODEL")  # names of paths under tmp_path
    argv = flags(tiny_model_dir, sft_jsonl, tmp_path / "out", "--steps", "1")
    for x in extra:
        if x in placeholders:
            argv.append(str(tmp_path / x))
        else:
            argv.append(x)
    with pytest.raises(SystemExit) as e:
        sft.main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2, err
    assert err.startswith("error: ") and "\n" not in err and needle in err, err
    marked = [m for m in runs.RUN_MARKERS if os.path.exists(tmp_path / "out" / m)]
    assert not marked, "the fixed command may reuse --out"


def test_broken_checkpoint_names_the_missing_file_and_a_half_done_swap_recovers(
    tiny_model_dir, sft_jsonl, tmp_path, capsys
):
    sft.main(flags(tiny_model_dir, sft_jsonl, tmp_path, "--steps", "2"))
    ckpt = tmp_path / "checkpoint"
    os.replace(ckpt, tmp_path / "checkpoint.old")  # killed between a checkpoint swap's two renames
    with pytest.raises(SystemExit) as e:
        sft.parse_args(["--resume", str(tmp_path), "--dry-run"])
    # a dry run only looks: nothing moves
    dry = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert e.value.code == 0
    assert dry["resume"] == str(tmp_path / "checkpoint.old")
    assert not ckpt.exists()
    # a real resume recovers the swap
    assert sft.parse_args(["--resume", str(tmp_path)]).resume == str(ckpt)
    for name, needle in (
        ("optimizer.pt", "optimizer.pt is missing"),
        ("model.safetensors", "no weights"),
    ):
        os.replace(ckpt / name, tmp_path / name)
        with pytest.raises(SystemExit) as e:
            sft.main(["--resume", str(tmp_path)])
        assert e.value.code == 2 and needle in capsys.readouterr().err
        os.replace(tmp_path / name, ckpt / name)


def dry(argv, capsys):
    """The effective configuration --dry-run prints as its last line."""
    with pytest.raises(SystemExit) as e:
        sft.parse_args(argv + ["--dry-run"])
    assert e.value.code == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_dry_run_prints_the_effective_config_and_task_defaults(
    tiny_model_dir, sft_jsonl, tmp_path, capsys
):
    # the embedded model on Countdown: what made it
    cfg = dry(["--out", str(tmp_path / "x")], capsys)
    assert cfg["eval_max_tokens"] == 128
    assert cfg["prompt"] == "r1_zero"
    assert cfg["eval_prompt"] == "r1_zero"
    assert cfg["eval_path"] == "synthetic"
    assert cfg["eval_reward"] == "countdown"
    assert cfg["param_dtype"] == cfg["compute_dtype"] == "float32"
    assert cfg["micro_batch_size"] == 8
    assert not os.path.exists(tmp_path / "x"), "a dry run writes nothing"
    # a stand-in for a hub model on MATH (seed 000 §3.2), with grpo.py's flag spellings
    hub_argv = ["--model", tiny_model_dir, "--data", sft_jsonl, "--eval-task", "math"]
    hub_argv += ["--grad-accum", "2", "--clip", "0.5", "--share-prefix", "--dtype", "bfloat16"]
    hub = dry(hub_argv, capsys)
    assert hub["eval_max_tokens"] == 2048
    assert hub["eval_prompt"] == "intellect"
    assert hub["eval_reward"] == "question_only"
    assert hub["gradient_accumulation_steps"] == 2
    assert hub["max_grad_norm"] == 0.5
    assert hub["shared_prefix"] is True
    assert hub["param_dtype"] == "float32"
    assert hub["compute_dtype"] == "bfloat16"
    # a hub model trains on Countdown with the seeds' prompt
    assert dry(["--model", tiny_model_dir, "--eval-n", "0"], capsys)["prompt"] == "countdown"


def test_sleep_engine_call_order(tiny_model_dir, sft_jsonl, tmp_path, monkeypatch):
    """The engine sleeps from its start until the first validation, and again after every
    validation; each validation wakes it with the policy's weights first. CPU engines have no
    sleep mode: this checks the calls, not the CUDA memory effect (not run here)."""
    calls = []

    def recorded(name, real):
        def call(*a, **kw):
            calls.append(name)
            return real(*a, **kw)

        return call

    for name in ("sleep_engine", "wake_engine", "load_policy_into_vllm", "generate"):
        monkeypatch.setattr(rollout, name, recorded(name, getattr(rollout, name)))
    # one microbatch = one step here
    train = recorded("train", sft.sft_microbatch_train_step)
    monkeypatch.setattr(sft, "sft_microbatch_train_step", train)

    def run(out):
        argv = flags(tiny_model_dir, sft_jsonl, out, "--steps", "2", "--eval-every", "1")
        argv += ["--eval-task", "countdown", "--eval-path", "synthetic", "--eval-n", "2"]
        return argv + ["--eval-max-tokens", "4", "--engine", "hf"]

    sft.main(run(tmp_path / "a") + ["--sleep-engine"])
    wake = ["wake_engine", "generate", "sleep_engine"]  # (the HF engine's wake is a push: left out)
    expected = ["sleep_engine"] + wake + ["train"] + wake + ["train"] + wake  # step 0's first
    assert [c for c in calls if c != "load_policy_into_vllm"] == expected
    calls.clear()
    sft.main(run(tmp_path / "b"))
    assert (
        calls
        == ["load_policy_into_vllm", "generate"]
        + ["train", "load_policy_into_vllm", "generate"] * 2
    )


def test_tiny_tokenizers_survive_a_reload(tmp_path):
    """encode(text) with the tokenizer as built == with what AutoTokenizer reloads, for every
    family. Control: a llama-style (GPT-2 split) tokenizer saved under a qwen2 config is re-split
    on reload, the trap avoided here."""
    from tokenizers import Tokenizer

    problems = load_task("countdown", "train", path="synthetic", limit=50, seed=3, prompt="r1_zero")
    texts = [r["prompt"] + sft.countdown_trace(**r["ground_truth"]) for r in problems]
    texts += ["Ünïcödé ﬁ 3.14159 \\boxed{\\frac{1}{2}}\r\n\tend"]
    for family in sft.FAMILIES:
        d = sft.build_tiny_model(
            str(tmp_path / family), family=family, hidden_size=64, num_layers=1, vocab_size=400
        )
        built = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        reloaded = transformers.AutoTokenizer.from_pretrained(d)
        assert transformers.AutoConfig.from_pretrained(d).model_type == family
        for t in texts:
            ids = built.encode(t, add_special_tokens=False).ids
            assert ids == reloaded(t, add_special_tokens=False).input_ids, (family, t)
        ids = reloaded(" 10 =", add_special_tokens=False).input_ids
        digits = [reloaded.decode([i]) for i in ids]
        if family == "llama":
            assert digits == [" 10", " ="], (family, digits)  # GPT-2's split: a number, one token
        else:
            assert digits == [" ", "1", "0", " ="], (family, digits)  # Qwen2's: one digit a token
    transformers.AutoConfig.for_model("qwen2").save_pretrained(tmp_path / "llama")
    trap = transformers.AutoTokenizer.from_pretrained(tmp_path / "llama")
    built = Tokenizer.from_file(str(tmp_path / "llama" / "tokenizer.json"))
    assert any(built.encode(t).ids != trap(t, add_special_tokens=False).input_ids for t in texts)


@requires_vllm
@pytest.mark.parametrize("fixture", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_tiny_families_load_in_vllm_and_greedy_equals_hf(fixture, request):
    path = request.getfixturevalue(fixture)
    llm = rollout.init_vllm(path, device="cpu", seed=0, max_model_len=256, enforce_eager=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == fixture.split("_")[1]
    prompts = ["Using the numbers [3, 5, 7], create", "<think> 12 + 30 = 42 </think>"]
    for p, o in zip(prompts, rollout.generate(llm, prompts, temperature=0.0, max_tokens=8)):
        ids = tok(p, return_tensors="pt").input_ids
        generated = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None)
        hf = generated[0, ids.shape[1] :].tolist()
        assert o[0]["token_ids"] == hf[: len(o[0]["token_ids"])] and len(o[0]["token_ids"]) > 0
    del llm


def test_n_examples_subsets_are_seeded_and_nested():
    rows = list(range(100))
    assert sft.subset(rows, "16", 0) == sft.subset(rows, "16", 0)
    assert sft.subset(rows, "16", 0) != sft.subset(rows, "16", 1)
    assert set(sft.subset(rows, "8", 3)) <= set(sft.subset(rows, "16", 3))
    assert sft.subset(rows, "all", 0) == rows


def test_n_examples_counts_only_pairs_within_max_seq_len(
    tiny_model_dir, sft_jsonl, tmp_path, monkeypatch, capsys
):
    """Issue 28: --n-examples 6 trains on 6 distinct pairs when the data also holds long ones:
    pairs over --max-seq-len are excluded before the subset is drawn, and one line counts them."""
    short = open(sft_jsonl).read().splitlines()  # 8 pairs of 400-1000 tokens
    long = []
    for line in short[:4]:
        pair = json.loads(line)
        long.append(json.dumps({**pair, "response": pair["response"] * 40}))
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(short + long) + "\n")
    seen = set()  # every (prompt, response) a train step gets
    real_train_step = sft.train_step

    def recording_train_step(model, tokenizer, optimizer, scheduler, pairs, *rest):
        seen.update((p["prompt"], p["response"]) for p in pairs)
        return real_train_step(model, tokenizer, optimizer, scheduler, pairs, *rest)

    monkeypatch.setattr(sft, "train_step", recording_train_step)
    extra = ["--n-examples", "6", "--batch-size", "2", "--steps", "3", "--max-seq-len", "1024"]
    sft.main(flags(tiny_model_dir, str(mixed), tmp_path / "run", *extra))
    assert len(seen) == 6  # 3 steps of 2: one epoch of the subset
    assert all(json.dumps({"prompt": p, "response": r}) in short for p, r in seen)
    out = capsys.readouterr().out
    assert "4 of 12 pairs excluded as longer than --max-seq-len 1024" in out
    assert "training on 6 (--n-examples 6, --seed 0)" in out
    # asking for more than fit is one line naming both counts
    argv = flags(tiny_model_dir, str(mixed), tmp_path / "run2", *extra, "--n-examples", "10")
    with pytest.raises(SystemExit):
        sft.main(argv)
    err = capsys.readouterr().err
    assert "--n-examples 10: only 8 of the 12 pairs fit --max-seq-len 1024" in err


def test_from_scratch_cli_smoke_with_hf_engine_validation(tmp_path):
    """The path that made models/countdown-tiny, at toy size, from the command line (in-process:
    conftest.run_script), validating through --engine hf."""
    cmd = ["sft.py"]
    cmd += ["--init-config", "tiny", "--hidden-size", "64", "--layers", "1", "--countdown-n", "64"]
    cmd += ["--steps", "2", "--batch-size", "8", "--gradient-accumulation-steps", "2"]
    cmd += ["--shared-prefix", "--lr", "1e-3"]
    cmd += ["--eval-n", "4", "--eval-every", "1", "--engine", "hf", "--out", str(tmp_path)]
    cmd += ["--eval-samples", "2", "--eval-max-tokens", "32"]
    cmd += ["--save-every", "1", "--keep-checkpoints", "1"]
    res = run_script(cmd)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "step 2/2 |" in res.stdout and "eval 3 @ step 2" in res.stdout
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    evals = [r for r in rows if "eval_step" in r]
    assert [(r["step"], r["eval_step"]) for r in evals] == [(0, 1), (1, 2), (2, 3)]
    for k in (
        "eval/accuracy",
        "eval/format_reward",
        "eval/answer_reward",
        "eval/response_len",
        "eval/truncation_rate",
        "time/eval",
        "time/weight_sync",
    ):
        assert all(0 <= r[k] for r in evals), k
    assert all(r["eval/accuracy"] <= r["eval/format_reward"] + 1e-9 for r in evals)
    # --eval-samples 2: the sampled keys beside the greedy ones; the question count
    for r in evals:
        assert r["eval/n_questions"] == 4
        assert 0 <= r["eval/avg@k"] <= r["eval/pass@k"] <= 1
        assert "eval/maj@k_se" in r
    # --keep-checkpoints 1: the last save's weights only
    # (written.json: the snapshots this run wrote, the only ones it may rotate away)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step_0002", "written.json"]
    assert os.path.exists(tmp_path / "rollouts" / "step_0002.jsonl")
    assert os.path.exists(tmp_path / "dashboard.png")
    for f in ("config.json", "model.safetensors", "tokenizer.json", "state.json"):
        assert os.path.exists(tmp_path / "model" / f), f
    # a number seen in training stays one token
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "model")
    ids = tok(" 10 =", add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in ids] == [" 10", " ="]


@requires_vllm
def test_checkpoint_round_trips_through_vllm_with_eval(tiny_model_dir, sft_jsonl, tmp_path):
    """Train with validation through the engine, then load the saved dir in a fresh engine: greedy
    = HF."""
    argv = flags(tiny_model_dir, sft_jsonl, tmp_path, "--steps", "2", "--eval-every", "1")
    argv += ["--eval-task", "countdown", "--eval-path", "synthetic"]
    argv += ["--eval-n", "4", "--eval-max-tokens", "8", "--eager"]
    hist = sft.main(argv)
    evals = [r for r in hist if "eval/accuracy" in r]
    assert [r["eval_step"] for r in evals] == [1, 2, 3]  # before training, then each step
    assert 0 <= evals[-1]["eval/format_reward"] <= 1
    assert os.path.exists(tmp_path / "rollouts" / "step_0002.jsonl")
    save = str(tmp_path / "model")
    llm = rollout.init_vllm(save, device="cpu", seed=0, max_model_len=512, enforce_eager=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(save)
    tok = transformers.AutoTokenizer.from_pretrained(save)
    prompts = [json.loads(line)["prompt"] for line in open(sft_jsonl)][:3]
    outs = rollout.generate(llm, prompts, temperature=0.0, max_tokens=12)
    for p, o in zip(prompts, outs):
        ids = tok(p, return_tensors="pt").input_ids
        generated = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
        hf = generated[0, ids.shape[1] :].tolist()
        assert o[0]["token_ids"] == hf[: len(o[0]["token_ids"])]
    del llm


@requires_vllm
@pytest.mark.skipif(
    not os.path.exists(os.path.join(SHIPPED, "config.json")),
    reason="models/countdown-tiny not built",
)
def test_shipped_model_loads_and_eval_zero_shot_matches_model_card(tmp_path):
    """HF loads it; eval_zero_shot (vLLM-CPU) reproduces the card's greedy accuracy (+-3 points)
    and format rate."""
    import eval_zero_shot

    model = transformers.AutoModelForCausalLM.from_pretrained(SHIPPED)
    assert model.config.model_type == "llama" and model.config.head_dim == 64
    size = sum(os.path.getsize(os.path.join(SHIPPED, f)) for f in os.listdir(SHIPPED))
    assert size < 20 * 2**20
    card = open(os.path.join(SHIPPED, "MODEL_CARD.md")).read()
    m = re.search(
        r"eval_zero_shot\.py --limit (\d+) --max-tokens (\d+)`: "
        r"accuracy ([\d.]+), format rate ([\d.]+)",
        card,
    )
    assert m, "MODEL_CARD.md lost its measured-accuracy line"
    limit = int(m[1])
    max_tokens = int(m[2])
    acc = float(m[3])
    fmt = float(m[4])
    eval_zero_shot.main(
        ["--limit", str(limit), "--max-tokens", str(max_tokens), "--workers", "1"]
        + ["--out", str(tmp_path)]
    )
    row = json.load(open(tmp_path / "summary.json"))["rows"][0]
    assert abs(row["accuracy"] - acc) <= 0.03
    gens = [json.loads(line) for line in open(tmp_path / "generations.jsonl")]
    assert abs(sum(g["format_reward"] for g in gens) / len(gens) - fmt) <= 0.03


def adapter_tensors(directory):
    """The tensors of a saved adapter (lora.save_adapter's file)."""
    from safetensors.torch import load_file

    import lora

    return list(load_file(os.path.join(directory, lora.ADAPTER_WEIGHTS)).values())


def parameters(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def test_lora_optimizer_holds_the_adapters_and_resume_continues(
    tiny_model_dir, sft_jsonl, tmp_path
):
    """--lora-rank 2: the checkpoint holds the adapter, not the model, and its AdamW state is the
    adapter's alone (one exp_avg per adapter parameter); 2 steps resumed to 4 equal 4 straight.
    One thread (a busy box), restored after."""
    lora_flags = ["--lora-rank", "2", "--min-lr-frac", "1", "--save-every", "0", "--threads", "1"]
    threads = torch.get_num_threads()
    cut = tmp_path / "cut"
    try:
        sft.main(flags(tiny_model_dir, sft_jsonl, cut, "--steps", "2", *lora_flags))
        resumed = train_rows(sft.main(["--resume", str(cut), "--steps", "4"]))
        straight = sft.main(
            flags(tiny_model_dir, sft_jsonl, tmp_path / "b", "--steps", "4", *lora_flags)
        )
    finally:
        torch.set_num_threads(threads)
    ckpt = cut / "checkpoint"
    assert (ckpt / "adapter_config.json").exists() and not (ckpt / "model.safetensors").exists()
    adapter = adapter_tensors(ckpt)
    n = sum(t.numel() for t in adapter)
    opt = torch.load(ckpt / "optimizer.pt")
    assert sum(len(group["params"]) for group in opt["param_groups"]) == len(adapter)
    assert sum(s["exp_avg"].numel() for s in opt["state"].values()) == n
    assert 0 < n < parameters(tiny_model_dir) / 10
    straight = train_rows(straight)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(resumed, straight):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5)
    assert straight[-1]["train/loss"] < straight[0]["train/loss"]  # the adapters trained
