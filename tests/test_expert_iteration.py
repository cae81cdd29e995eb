"""expert_iteration.py, in-process on the embedded model (--engine hf: no engine start-up):
keep_correct on hand-built batches (the correct, finished responses exactly, the --max-per-question
cap, a correct response cut at --max-tokens counted and not kept), the EOS token a kept response
ended with in its SFT target, the optimizer steps of a step's SFT (no pair repeated) and their
gradient (the mean over a step's pairs, against a hand computation), the entropy it logs against
grpo.py's train/entropy on one real batch (module fixture `live`), and two steps of main() end to
end, straight through and as one step plus a --resume (module fixture `runs`): the logged keys
(each in docs/metrics.md's glossary), the kept fraction, the resumed step equal to the straight
run's, refused bad input, SIGTERM; --tools: one step with the calculator (its tool metrics, and
the SFT pairs the engine's ids with the policy mask as loss mask) and an id pair's masked loss at
the gradient level under bf16 autocast.
"""

import contextlib
import io
import json
import os
import re
import signal

import pytest
import torch

import data
import expert_iteration as ei
import grpo
import hardware
import losses
import plot
import sft
from test_grpo import glossary_keys

# 2 questions x 4 samples a step, SFT in microbatches of 2, greedy validation on 2 questions at the
# end only, on CPU: the embedded model answers a Countdown question in 30-60 tokens. One torch
# thread: on a loaded machine two spin-waiting threads made the same run 30x slower
TINY_FLAGS = (
    "--ei-batch-size 2 --group-size 4 --batch-size 4 --gradient-accumulation-steps 2 "
    "--max-tokens 64 --eval-n 2 --eval-every 0 --grader-workers 0 --engine hf --lr 1e-3 "
    "--threads 1"
).split()

RIGHT = {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}
WRONG = {"reward": 0.1, "format_reward": 1.0, "answer_reward": 0.0}


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def step_rows(rows):
    """The EI step rows (not the eval rows)."""
    return [r for r in rows if "train/kept_frac" in r]


def run_main(flags):
    """expert_iteration.main in this process -> its stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ei.main(ei.parse_args(flags))
    return out.getvalue()


def hand_batch(tokenizer, prompts, responses, eos_ended):
    """A batch as ei.sample returns it, for the pairs' columns: each response's token ids with the
    tokenizer's EOS after them where eos_ended says so."""
    batch = {"prompts": prompts, "responses": responses, "prompt_ids": [], "response_ids": []}
    for prompt, response, eos in zip(prompts, responses, eos_ended):
        batch["prompt_ids"].append(tokenizer(prompt)["input_ids"])
        ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        if eos:
            ids = ids + [tokenizer.eos_token_id]
        batch["response_ids"].append(ids)
    batch["stop_token_ids"] = [tokenizer.eos_token_id]
    return batch


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The step-0 batch of the tiny flags, sampled by the HF engine, and what made it."""
    args = ei.parse_args(TINY_FLAGS + ["--out", str(tmp_path_factory.mktemp("ei_live"))])
    runtime = grpo.setup_runtime(args)
    train_rows, _ = ei.load_data(args)
    learner = ei.build_learner(args, runtime)
    engine = grpo.make_engine(args.model, args, runtime)
    batch, stats = ei.sample(engine, train_rows, args, 0)
    return {
        "args": args,
        "runtime": runtime,
        "learner": learner,
        "batch": batch,
        "stats": stats,
    }


# ----------------------------------------------------------------------------- keep_correct
@pytest.mark.parametrize("cap,want", [(0, [0, 2, 3, 7]), (1, [0, 7]), (2, [0, 2, 7])])
def test_keep_correct_keeps_the_correct_responses_up_to_the_cap(cap, want):
    """Two questions x 4 samples: question 0 answered right by samples 0, 2, 3; question 1 by its
    last. A wrong answer in the right format is not kept."""
    args = ei.parse_args(["--group-size", "4", "--max-per-question", str(cap)])
    rewards = [RIGHT, WRONG, RIGHT, RIGHT] + [WRONG] * 3 + [RIGHT]
    assert ei.keep_correct({"rewards": rewards, "truncated": [False] * 8}, args) == want


def test_a_correct_response_cut_at_max_tokens_is_counted_not_kept():
    """Sample 1 is correct but was cut at --max-tokens (so were the wrong sample 2): not kept, and
    train/truncated_correct_frac counts it (1 of 4); the kept fraction does not."""
    args = ei.parse_args(["--group-size", "4"])
    batch = {
        "rewards": [RIGHT, RIGHT, WRONG, RIGHT],
        "truncated": [False, True, True, False],
        "response_ids": [[5] * 10, [5] * 64, [5] * 64, [5] * 20],
    }
    kept = ei.keep_correct(batch, args)
    assert kept == [0, 3]
    entropy = (torch.ones(4), torch.full((4,), 2.0))  # (N,) sums, (N,) token counts
    logged = ei.summarize(batch, kept, entropy, {"generation_s": 0.0, "grading_s": 0.0})
    assert logged["train/truncated_correct_frac"] == 0.25
    assert logged["train/kept_frac"] == 0.5
    assert logged["train/answer_reward"] == 0.75


# ----------------------------------------------------------------------------- SFT targets
def test_a_response_the_engine_ended_with_eos_trains_on_eos(live):
    """The engine's text drops the EOS it stopped on: the pair's response puts it back, and sft.py's
    tokenisation turns it into the one EOS id as the last target. A response ended by the stop
    string gets no EOS."""
    tokenizer = live["learner"]["tokenizer"]
    eos = tokenizer.eos_token_id
    assert eos in live["batch"]["stop_token_ids"]  # the engine's stop ids hold the tokenizer's EOS
    prompts = ["Using 1 2 3, make 6.", "Using 2 2, make 4."]
    responses = ["<answer>1+2+3</answer> done", "<answer>2+2</answer>"]
    batch = hand_batch(tokenizer, prompts, responses, eos_ended=[True, False])
    pairs = ei.sft_pairs(batch, [0, 1], tokenizer)
    assert [p["n_tokens"] for p in pairs] == [
        len(p) + len(r) for p, r in zip(batch["prompt_ids"], batch["response_ids"])
    ]
    t = losses.tokenize_prompt_and_output(
        [p["prompt"] for p in pairs], [p["response"] for p in pairs], tokenizer
    )
    for i in range(2):
        targets = t["labels"][i][t["response_mask"][i]].tolist()
        assert targets == batch["response_ids"][i]  # the engine's ids, EOS included in row 0
    assert targets[-1] != eos


# ----------------------------------------------------------------------------- SFT steps
def test_each_epoch_trains_every_kept_pair_once_without_repeats():
    args = ei.parse_args(["--batch-size", "4", "--gradient-accumulation-steps", "2"])
    assert args.epochs == 2  # the demo profile's
    # fewer kept pairs than --batch-size: one step of the 3 an epoch, none repeated to fill it
    batches = ei.sft_batches(3, args, step=0)
    assert [sorted(b) for b in batches] == [[0, 1, 2], [0, 1, 2]]
    # 10 pairs, 1.5 epochs: ceil(10 / 4) = 3 steps of 4 + 3 + 3, then the first 5 of a new
    # permutation in ceil(5 / 4) = 2 steps of 3 + 2 (not 4 + 4 + 2 and 4 + 1)
    flags = ["--batch-size", "4", "--gradient-accumulation-steps", "2", "--epochs", "1.5"]
    args = ei.parse_args(flags)
    batches = ei.sft_batches(10, args, step=0)
    assert [len(b) for b in batches] == [4, 3, 3, 3, 2]
    assert sorted(batches[0] + batches[1] + batches[2]) == list(range(10))
    for b in batches:
        assert len(set(b)) == len(b)
    # 33 pairs at --batch-size 32: 17 + 16, no lone pair taking a full optimizer step
    flags = ["--batch-size", "32", "--gradient-accumulation-steps", "2", "--epochs", "1"]
    batches = ei.sft_batches(33, ei.parse_args(flags), step=0)
    assert [len(b) for b in batches] == [17, 16]
    assert sorted(batches[0] + batches[1]) == list(range(33))


def test_nothing_kept_is_no_update_and_a_notice(capsys):
    args = ei.parse_args([])
    assert ei.sft_on_kept(None, {}, [], args, None, step=3) == {}
    assert "notice: step 3: no correct response kept; no SFT update" in capsys.readouterr().out


def test_a_short_step_is_the_mean_over_its_pairs_at_the_gradient_level(live):
    """3 kept pairs, --batch-size 4 in microbatches of 2: one optimizer step of the 3 (a microbatch
    of 2 and one of 1). With SGD at lr 1 and no clipping the update is minus the gradient, which
    must be that of mean over the 3 pairs of (summed response NLL / --normalize-constant), computed
    here pair by pair (the old fill-by-repeating or a 1/--gradient-accumulation-steps weight per
    microbatch gives another)."""
    flags = ["--batch-size", "4", "--gradient-accumulation-steps", "2", "--epochs", "1"]
    flags += ["--max-grad-norm", "1e9", "--normalize-constant", "3"]
    args = ei.parse_args(flags)
    runtime = live["runtime"]
    policy, tokenizer = grpo.load_policy(args.model, args, runtime)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    learner = {
        "policy": policy,
        "tokenizer": tokenizer,
        "optimizer": optimizer,
        "scheduler": torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0),
    }
    prompts = ["Using 1 2 3, make 6.", "Using 2 2, make 4.", "Using 5 7 9 11, make 2."]
    responses = ["<answer>1+2+3</answer>", "<answer>2+2</answer>", "<answer>(9-7)</answer>"]
    batch = hand_batch(tokenizer, prompts, responses, eos_ended=[True, False, True])
    pairs = ei.sft_pairs(batch, [0, 1, 2], tokenizer)
    before = [p.detach().clone() for p in policy.parameters()]
    # the hand computation: each pair alone, its summed NLL over the engine's response ids
    policy.zero_grad()
    for i in range(3):
        ids = torch.tensor([batch["prompt_ids"][i] + batch["response_ids"][i]])  # (1, T)
        logits = policy(ids).logits[0, :-1].float()  # (T-1, V)
        log_probs = logits.log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]  # (T-1,)
        n_prompt = len(batch["prompt_ids"][i])
        nll = -log_probs[n_prompt - 1 :].sum()  # the response tokens' labels
        (nll / args.normalize_constant / 3).backward()
    expected = [p.grad.detach().clone() for p in policy.parameters()]
    policy.zero_grad()
    assert [p["response"] for p in pairs] != responses  # EOS appended on rows 0 and 2
    row = ei.sft_on_kept(learner, batch, [0, 1, 2], args, runtime, step=0)
    assert row["train/sft_steps"] == 1
    for p, p0, g in zip(policy.parameters(), before, expected):
        torch.testing.assert_close(p0 - p.detach(), g, rtol=1e-3, atol=1e-6)


# ----------------------------------------------------------------------------- entropy
def test_entropy_over_all_responses_is_grpo_train_entropy(live):
    """On one real batch of the embedded model, the entropy expert_iteration.py logs over all
    sampled responses equals grpo.py's train/entropy (its training forward, one optimizer step on
    the same batch): the two curves compare."""
    args = live["args"]
    runtime = live["runtime"]
    batch = dict(live["batch"])
    kept = ei.keep_correct(batch, args)
    entropy = ei.response_entropy(live["learner"]["policy"], batch, args, runtime)
    logged = ei.summarize(batch, kept, entropy, live["stats"])
    sizes = ["--rollout-batch-size", "8", "--group-size", "4", "--train-batch-size", "8"]
    gargs = grpo.parse_args(sizes + ["--gradient-accumulation-steps", "2", "--max-tokens", "64"])
    batch["raw"] = torch.tensor([d["reward"] for d in batch["rewards"]])
    history, _ = grpo.train_step(grpo.build_learner(gargs, runtime), batch, gargs, runtime, 0)
    assert logged["train/entropy"] == pytest.approx(history[0]["train/entropy"], rel=1e-4)
    # the kept ones: the same per-token entropies, weighted over the kept responses' tokens only
    assert logged["train/kept_frac"] == len(kept) / 8
    if kept:
        assert logged["train/entropy_kept"] > 0


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two steps straight through; one step, then --resume naming only the run and the new step
    count. In this process (main() as the script runs it)."""
    d = tmp_path_factory.mktemp("ei")
    straight = run_main(TINY_FLAGS + ["--n-ei-steps", "2", "--out", str(d / "straight")])
    run_main(TINY_FLAGS + ["--n-ei-steps", "1", "--out", str(d / "resumed")])
    resumed = run_main(["--resume", str(d / "resumed"), "--n-ei-steps", "2"])
    return {
        "dir": d,
        "straight": metrics(d / "straight"),
        "resumed": metrics(d / "resumed"),
        "stdout": straight,
        "resume_stdout": resumed,
    }


def test_two_steps_log_every_key_keep_the_correct_ones_and_save(runs):
    rows = runs["straight"]
    steps = step_rows(rows)
    assert [r["step"] for r in steps] == [0, 1]
    for r in steps:
        assert set(ei.STEP_KEYS) <= set(r), set(ei.STEP_KEYS) - set(r)
        # answer rewards are 0 or 1 and nothing is capped: kept = answered correctly and finished
        answered = r["train/kept_frac"] + r["train/truncated_correct_frac"]
        assert answered == pytest.approx(r["train/answer_reward"])
        if r["train/kept_frac"] > 0:
            assert set(ei.SFT_KEYS) <= set(r), set(ei.SFT_KEYS) - set(r)
            # 2 epochs (the demo's) of ceil(kept / 4 pairs a step)
            assert r["train/sft_steps"] == 2 * -(-round(r["train/kept_frac"] * 8) // 4)
        else:
            assert "train/loss" not in r
    assert steps[1]["opt_step"] == steps[0]["opt_step"] + steps[1].get("train/sft_steps", 0)
    assert any(r["train/kept_frac"] > 0 for r in steps), "the embedded model should solve some"
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [2]  # --eval-every 0: the end only
    missing = sorted(set().union(*rows) - glossary_keys())
    assert not missing, missing
    d = runs["dir"] / "straight"
    assert {"config.json", "model.safetensors", "optimizer.pt", "state.json"} <= set(
        os.listdir(d / "checkpoint")
    )
    assert os.path.getsize(d / "dashboard.png") > 10_000
    # the dashboard draws both entropies and the kept fraction, and times the entropy pass
    fig = plot.build_figure([str(d)])
    titles = {ax.get_title(): ax for ax in fig.axes}
    drawn = []
    for title in ("token entropy", "train reward"):
        drawn += [line.get_label().split()[-1] for line in titles[title].lines]
    assert {"train/entropy", "train/entropy_kept", "train/kept_frac"} <= set(drawn)
    assert "time/entropy" in plot.time_split(rows)
    with open(d / "args.json") as f:
        assert json.load(f)["profile"] == "demo"
    assert re.search(r"^step 2/2 \| .*answer_reward [0-9.]+ \| kept_frac", runs["stdout"], re.M)


def test_resume_continues_as_the_straight_run(runs):
    assert "resume: restored the run's flags" in runs["resume_stdout"]
    assert "n_ei_steps 1 -> 2" in runs["resume_stdout"]
    resumed = step_rows(runs["resumed"])
    straight = step_rows(runs["straight"])
    assert [r["step"] for r in resumed] == [0, 1]
    assert [r["opt_step"] for r in resumed] == [r["opt_step"] for r in straight]
    for key in ("train/answer_reward", "train/kept_frac", "train/response_len_mean"):
        assert resumed[1][key] == straight[1][key], key
    assert resumed[1]["train/entropy"] == pytest.approx(straight[1]["train/entropy"], rel=1e-4)
    if "train/loss" in straight[1]:
        assert resumed[1]["train/loss"] == pytest.approx(straight[1]["train/loss"], rel=1e-4)


def one_line_error_in_process(capsys, call, needle):
    """call() stops with one `error: ...` line on stderr containing needle, exit code 2."""
    with pytest.raises(SystemExit) as exit_:
        call()
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines


def test_bad_input_is_one_line_before_loading(tmp_path, capsys):
    flags = ["--batch-size", "3", "--gradient-accumulation-steps", "2"]
    needle = "--batch-size must be divisible by --gradient-accumulation-steps"
    one_line_error_in_process(capsys, lambda: ei.parse_args(flags), needle)
    path = tmp_path / "two.jsonl"
    rows = [{"numbers": [3, 4, 5], "target": 17}] * 2
    data.write_jsonl_atomic(str(path), rows)
    flags = ["--train-path", str(path), "--ei-batch-size", "4", "--out", str(tmp_path / "o")]
    args = ei.parse_args(flags)
    one_line_error_in_process(capsys, lambda: ei.load_data(args), "--ei-batch-size 4")
    # grpo.py's pass-rate filter (grpo.load_rows): its flags' check, and a file without the prompts
    flags = ["--keep-pass-rate", "0", "1"]
    one_line_error_in_process(capsys, lambda: ei.parse_args(flags), "go together")
    rates = tmp_path / "pass_rates.jsonl"
    data.write_jsonl_atomic(str(rates), [{"prompt": "another prompt", "pass_rate": 0.5}])
    flags = ["--train-path", str(path), "--ei-batch-size", "1", "--out", str(tmp_path / "o2")]
    flags += ["--pass-rates", str(rates), "--keep-pass-rate", "0", "1"]
    args = ei.parse_args(flags)
    needle = "has no pass rate for 2 of the 2 training prompts"
    one_line_error_in_process(capsys, lambda: ei.load_data(args), needle)
    # with a tool, every turn's seeds fit the step's 2^20: 9 turns x 2 x 65536 samples do not
    flags = ["--tools", "calculator", "--ei-batch-size", "8192", "--group-size", "8"]
    needle = "(--max-tool-calls + 1) x 2 x --ei-batch-size x --group-size must be <= 2^20"
    one_line_error_in_process(capsys, lambda: ei.parse_args(flags), needle)


def test_sigterm_saves_the_steps_done(tmp_path, monkeypatch, sigterm, capsys):
    """SIGTERM during step 1's rollout, with the demo's --save-every 0: step 0 is saved (weights,
    optimizer, counters) and the run exits 143."""
    flags = TINY_FLAGS + ["--max-tokens", "8", "--n-ei-steps", "3", "--out", str(tmp_path)]
    real = ei.sample

    def sample(engine, train_rows, args, step, tool=None):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(engine, train_rows, args, step, tool)

    monkeypatch.setattr(ei, "sample", sample)
    with pytest.raises(SystemExit) as exit_:
        ei.main(ei.parse_args(flags))
    assert exit_.value.code == 143
    assert "SIGTERM: saving checkpoint" in capsys.readouterr().out
    with open(tmp_path / "checkpoint" / "state.json") as f:
        state = json.load(f)
    rows = step_rows(metrics(tmp_path))
    assert state["step"] == 1
    assert [r["step"] for r in rows] == [0]
    assert state["opt_step"] == rows[-1]["opt_step"]
    assert os.path.isfile(tmp_path / "checkpoint" / "optimizer.pt")


def test_lora_optimizer_holds_the_adapters_and_resume_continues(tmp_path):
    """--lora-rank 2: after one step the checkpoint holds the adapter (not the model) and an AdamW
    state over the adapter's tensors alone; --resume continues to step 2 from it."""
    from safetensors.torch import load_file

    import lora

    out = tmp_path / "lora"
    run_main(TINY_FLAGS + ["--lora-rank", "2", "--n-ei-steps", "1", "--out", str(out)])
    ckpt = out / "checkpoint"
    assert lora.is_adapter_dir(ckpt) and not (ckpt / "model.safetensors").exists()
    adapter = load_file(ckpt / lora.ADAPTER_WEIGHTS)
    opt = torch.load(ckpt / "optimizer.pt")
    assert sum(len(group["params"]) for group in opt["param_groups"]) == len(adapter)
    n = sum(t.numel() for t in adapter.values())
    assert sum(s["exp_avg"].numel() for s in opt["state"].values()) in (0, n)  # 0: none kept
    stdout = run_main(["--resume", str(out), "--n-ei-steps", "2"])
    assert "resume: restored the run's flags" in stdout
    assert [r["step"] for r in step_rows(metrics(out))] == [0, 1]
    assert set(load_file(ckpt / lora.ADAPTER_WEIGHTS)) == set(adapter)


# ----------------------------------------------------------------------------- --tools
def test_tools_calculator_run_trains_on_the_engines_ids_with_the_policy_mask(tmp_path, monkeypatch):
    """One step of --tools calculator on the embedded model (its default prompt,
    r1_zero_calculator): the step row logs the tool metrics and its line the calls; the pairs SFT
    trains on are the kept rows' prompt and response ids exactly as the engine produced them (no
    re-tokenising of the transcript), with the policy mask as the loss mask (0 on tool output)."""
    batches = []
    trained = []
    real_sample = ei.sample
    real_step = sft.train_step

    def recording_sample(engine, train_rows, args, step, tool=None):
        batch, stats = real_sample(engine, train_rows, args, step, tool)
        batches.append(batch)
        return batch, stats

    def recording_step(model, tokenizer, optimizer, scheduler, pairs, *rest):
        trained.extend(pairs)
        return real_step(model, tokenizer, optimizer, scheduler, pairs, *rest)

    monkeypatch.setattr(ei, "sample", recording_sample)
    monkeypatch.setattr(sft, "train_step", recording_step)
    flags = TINY_FLAGS + ["--tools", "calculator", "--max-tokens", "96", "--n-ei-steps", "1"]
    stdout = run_main(flags + ["--out", str(tmp_path)])
    rows = metrics(tmp_path)
    step = step_rows(rows)[0]
    logged = set().union(*rows)  # eval/tool_calls_mean is on the eval row
    assert set(ei.TOOL_KEYS) <= logged, set(ei.TOOL_KEYS) - logged
    assert step["tool/calls_mean"] > 0 and step["tool/obs_tokens_mean"] > 0
    assert re.search(r"^step 1/1 \| .*\| calls_mean [0-9.]+", stdout, re.M)
    assert step["train/kept_frac"] > 0, "the embedded model should solve one at --seed 0"
    batch = batches[0]
    kept = ei.keep_correct(batch, ei.parse_args(flags))
    assert len(trained) == 2 * len(kept)  # 2 epochs (the demo's) of the kept pairs
    by_ids = {tuple(p["prompt_ids"] + p["response_ids"]): p for p in trained}
    assert len(by_ids) == len(kept)
    for i in kept:
        pair = by_ids[tuple(batch["prompt_ids"][i] + batch["response_ids"][i])]
        assert "response" not in pair  # ids, not text to re-tokenise
        assert pair["prompt_ids"] == batch["prompt_ids"][i]
        assert pair["response_ids"] == batch["response_ids"][i]
        assert pair["loss_mask"] == batch["policy_masks"][i]
        assert 0 in pair["loss_mask"]  # the tool output, context without loss
        assert not batch["truncated"][i]
    with open(tmp_path / "args.json") as f:
        assert json.load(f)["prompt"] == "r1_zero_calculator"


def test_an_id_pairs_loss_reads_only_its_mask_at_the_gradient_level():
    """sft.train_step on two id pairs whose responses hold "tool output" (loss mask 0), under CPU
    bf16 autocast, SGD at lr 1, no clipping: the update is minus the gradient of the mean over
    the pairs of (NLL summed over the mask-1 tokens / --normalize-constant), computed here pair by
    pair with the model's own forward; with the masked tokens' loss counted it is far off, so the
    tool output carries no loss. The logged loss and nll_per_token are the masked ones."""
    flags = ["--batch-size", "2", "--gradient-accumulation-steps", "1", "--dtype", "bfloat16"]
    flags += ["--max-grad-norm", "1e9", "--normalize-constant", "3", "--threads", "1"]
    args = ei.parse_args(flags)
    runtime = grpo.setup_runtime(args)
    policy, tokenizer = grpo.load_policy(args.model, args, runtime)
    compute = getattr(torch, args.compute_dtype)
    assert compute == torch.bfloat16
    ids = tokenizer("Using 1 2 3, make 6. <answer>1+2+3 = 6 </answer>")["input_ids"]
    pairs = []
    for cut, masked in ((6, range(3, 6)), (8, range(2, 5))):  # prompt length, tool positions
        response = ids[cut:] + [tokenizer.eos_token_id]
        mask = [1] * len(response)
        for k in masked:
            mask[k] = 0
        pairs.append({"prompt_ids": ids[:cut], "response_ids": response, "loss_mask": mask})
        pairs[-1]["n_tokens"] = len(ids[:cut]) + len(response)

    def hand_gradient(use_mask):
        """The mean over the pairs of the (masked) summed response NLL / c, backpropagated."""
        policy.zero_grad()
        total = 0.0
        for pair in pairs:
            seq = torch.tensor([pair["prompt_ids"] + pair["response_ids"]])  # (1, T)
            with hardware.autocast("cpu", compute):
                logits = policy(seq).logits[0, :-1].float()  # (T-1, V)
            log_probs = logits.log_softmax(-1).gather(-1, seq[0, 1:, None])[:, 0]  # (T-1,)
            weights = torch.tensor([1.0] * len(pair["loss_mask"]))
            if use_mask:
                weights = torch.tensor(pair["loss_mask"], dtype=torch.float32)
            response = log_probs[len(pair["prompt_ids"]) - 1 :]  # the response tokens' labels
            nll = -(response * weights).sum() / args.normalize_constant / len(pairs)
            nll.backward()
            total += float(nll.detach())
        grads = torch.cat([p.grad.flatten() for p in policy.parameters()])
        policy.zero_grad()
        return grads, total

    expected, hand_loss = hand_gradient(use_mask=True)
    unmasked, _ = hand_gradient(use_mask=False)
    before = torch.cat([p.detach().flatten() for p in policy.parameters()])
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)
    # no shared prefix: whole sequences, as the hand forward runs them (in bf16 a prompt run
    # apart moves the gradient by ~2%)
    row = sft.train_step(policy, tokenizer, optimizer, scheduler, pairs, args, False)
    update = before - torch.cat([p.detach().flatten() for p in policy.parameters()])
    assert float((update - expected).norm() / expected.norm()) < 1e-2  # measured 2e-3
    assert float((unmasked - expected).norm() / expected.norm()) > 0.2  # measured 0.41
    assert row["train/loss"] == pytest.approx(hand_loss, rel=1e-3)
    n_policy = sum(sum(p["loss_mask"]) for p in pairs)
    nll_per_token = hand_loss * len(pairs) * args.normalize_constant / n_policy
    assert row["train/nll_per_token"] == pytest.approx(nll_per_token, rel=1e-2)
