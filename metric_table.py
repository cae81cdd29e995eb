"""Every metric the trainers log, in one table: key, who logs it, step-line format, meaning.

METRICS is the one source. From it come each trainer's step keys (`step_keys`), its `|`-separated
console line (`step_line`), the glossary in docs/metrics.md (`glossary`; `python metric_table.py
--write` rewrites it there, and a test checks the two agree), and the names the run doctor reads
(a test checks each is here). A new metric is one entry here plus the line that computes it:
`grpo.summarize` for the scored batch (both GRPO trainers call it), `grpo.train_step` for what the
learner measures. Keys are namespaced `train/`, `eval/`, `time/`, `tool/`, `ray/`.

    python metric_table.py           # print the glossary table
    python metric_table.py --write   # rewrite docs/metrics.md's table from METRICS
"""

import argparse
import os
from typing import NamedTuple

SCRIPTS = ("grpo", "grpo_ray", "expert_iteration", "sft")  # the trainers, by file name
GRPO = "grpo grpo_ray"  # the two GRPO trainers log the same step rows (grpo_ray adds ray/*)
TOOL_RUNS = f"{GRPO} expert_iteration"  # the trainers that take --tools (tools.py)


class Metric(NamedTuple):
    key: str  # the metrics.jsonl key
    every: str  # the scripts whose every step row has it (space-separated; "" = none)
    some: str  # the scripts that log it on some rows only (a flag's, an eval row's)
    line: dict  # script -> format on its step line ({} = on no line); grpo_ray prints grpo's
    meaning: str  # one line for the glossary


M = Metric
# The order is the step line's order (grpo.py's, then the others' additions), then the rest.
# One metric per entry; ruff leaves the table's layout alone.
# fmt: off
METRICS = [
    # --- counters
    M("step", f"{GRPO} expert_iteration sft", "", {},
      "rollout (EI) step, 0-based; sft: optimizer steps done; on eval rows, the updates the "
      "evaluated weights hold"),
    M("opt_step", f"{GRPO} expert_iteration", "", {}, "optimizer steps done after this row"),
    M("eval_step", "", "sft", {}, "1, 2, ... per validation (seed 000's second wandb axis)"),
    # --- the step line
    M("train/loss", f"{GRPO} sft", "expert_iteration",
      {"grpo": "+.4f", "expert_iteration": ".4f", "sft": ".4f"},
      "the optimizer step's loss (grpo: sum of its microbatch shares; sft: response NLL summed per"
      " example / --normalize-constant, batch mean)"),
    M("train/nll_per_token", "sft", "expert_iteration", {"sft": ".4f"},
      "response NLL per token (expert_iteration --tools: per policy token; tool output has no "
      "loss)"),
    M("train/reward", f"{GRPO} expert_iteration", "", {"grpo": ".3f"},
      "mean total reward of the rollout batch (every shaping term of grpo.score included; before a"
      " --kl-in reward penalty)"),
    M("train/answer_reward", f"{GRPO} expert_iteration", "",
      {"grpo": ".2f", "expert_iteration": ".3f"},
      "mean answer part of the rollout batch's reward"),
    M("train/all_correct_frac", GRPO, "", {"grpo": ".2f"},
      "fraction of the step's sampled groups (before --dynamic-sampling's filter) whose every "
      "response is correct"),
    M("train/all_wrong_frac", GRPO, "", {"grpo": ".2f"},
      "fraction of the step's sampled groups (before --dynamic-sampling's filter) with no correct "
      "response"),
    M("train/kept_frac", "expert_iteration", "", {"expert_iteration": ".3f"},
      "fraction of the step's samples kept for SFT: correct and finished by the engine (at most "
      "--max-per-question a question)"),
    M("train/response_len_mean", f"{GRPO} expert_iteration", "",
      {"grpo": ".1f", "expert_iteration": ".1f"},
      "mean response length in tokens the policy sampled (with --tools, tool output is not "
      "counted: train/response_len_total_mean counts it)"),
    M("train/truncation_rate", f"{GRPO} expert_iteration", "", {"grpo": ".2f"},
      "fraction of sampled responses cut at --max-tokens (with --tools, or ended by a tool output "
      "that did not fit)"),
    M("train/entropy", f"{GRPO} expert_iteration sft", "",
      {"grpo": ".3f", "expert_iteration": ".3f", "sft": ".3f"},
      "mean per-token entropy of the response tokens at the sampling temperature "
      "(expert_iteration: a no-grad pass over every sample before its SFT)"),
    M("train/entropy_kept", "", "expert_iteration", {"expert_iteration": ".3f"},
      "train/entropy over the kept responses only"),
    M("train/grad_norm", f"{GRPO} sft", "expert_iteration", {"grpo": ".3f", "sft": ".3f"},
      "gradient norm before clipping to --max-grad-norm"),
    M("train/lr", f"{GRPO} sft", "expert_iteration", {"sft": ".2e"},
      "learning rate of the optimizer step"),
    M("train/clip_fraction", GRPO, "", {"grpo": ".3f"},
      "fraction of response tokens whose ratio was clipped (clip losses)"),
    M("train/kl_ref", "", GRPO, {"grpo": ".2e"},
      "KL(pi_t || pi_init) on the batch by --kl-estimator, every --kl-every steps; 0 at step 0"),
    M("train/kl_prev", "", GRPO, {"grpo": ".2e"},
      "KL(pi_t || pi_t-1): how far the last update moved the policy, every --kl-every steps"),
    M("train/kl_penalty", "", GRPO, {"grpo": ".2e"},
      "--kl-in reward: the mean over responses of beta * sum_t (log pi_t - log pi_ref), taken off "
      "each reward"),
    M("train/sft_steps", "", "expert_iteration", {"expert_iteration": "d"},
      "optimizer steps of the step's SFT: each epoch's kept pairs in ceil(kept / --batch-size) "
      "steps"),
    M("tool/calls_mean", "", TOOL_RUNS, {"grpo": ".2f", "expert_iteration": ".2f"},
      "--tools: mean tool calls per sampled response"),
    M("time/generation", f"{GRPO} expert_iteration", "", {"grpo": ".1f", "expert_iteration": ".1f"},
      "seconds sampling the rollout batch (all rounds)"),
    M("time/training", f"{GRPO} expert_iteration", "", {"grpo": ".1f", "expert_iteration": ".1f"},
      "seconds of the optimizer steps"),
    M("time/tokens_per_s", GRPO, "", {"grpo": ".0f"}, "response tokens per second of the step"),
    M("train/tokens_per_s", "sft", "expert_iteration", {"sft": ".0f"},
      "prompt + response tokens trained per second"),
    # --- the rollout batch
    M("train/format_reward", f"{GRPO} expert_iteration", "", {},
      "mean format part of the rollout batch's reward"),
    M("train/zero_var_frac", GRPO, "", {},
      "fraction of groups whose G rewards are all equal: zero advantage, no signal"),
    M("train/response_len_max", f"{GRPO} expert_iteration", "", {},
      "longest sampled response (tokens)"),
    M("train/truncated_correct_frac", "expert_iteration", "", {},
      "fraction of samples correct but cut at --max-tokens: not kept (SFT on them teaches not to "
      "stop)"),
    M("train/kept_len_mean", "", "expert_iteration", {},
      "mean length (tokens) of the kept responses"),
    M("train/dynamic_filtered_frac", "", GRPO, {},
      "--dynamic-sampling: fraction of the sampled groups that were flat in --dynamic-sampling-on"),
    M("train/dynamic_prompts_sampled", "", GRPO, {},
      "--dynamic-sampling: prompts sampled to fill the batch"),
    M("train/length_reward", "", GRPO, {},
      "--length-reward-weight w: the batch mean of w x Kimi k1.5's length reward, a term of each "
      "reward (losses.kimi_length_reward)"),
    M("train/language_fraction", "", GRPO, {},
      "--language-reward-weight w: the batch mean fraction of the reasoning's words in "
      "--target-language (grader.language_fraction); w x it is a term of each reward"),
    # --- tools (--tools; grpo.tool_metrics)
    M("train/response_len_total_mean", "", TOOL_RUNS, {},
      "--tools: mean response length in tokens, tool output included (what --max-tokens counts)"),
    M("tool/calls_max", "", TOOL_RUNS, {}, "--tools: most tool calls in one response"),
    M("tool/frac_with_call", "", TOOL_RUNS, {}, "--tools: fraction of responses with a tool call"),
    M("tool/error_rate", "", TOOL_RUNS, {},
      "--tools: fraction of calls whose output is an error (timeouts included; a void call, "
      "with nothing to run, is in tool/void_turn_rate instead)"),
    M("tool/timeout_rate", "", TOOL_RUNS, {}, "--tools: fraction of calls cut at --tool-timeout"),
    M("tool/turns_mean", "", TOOL_RUNS, {},
      "--tools: mean turns (engine calls) per response: calls + 1, unless a tool output ended it"),
    M("tool/truncated_by_tool_rate", "", TOOL_RUNS, {},
      "--tools: fraction of responses ended because a tool output did not fit in --max-tokens"),
    M("tool/void_turn_rate", "", TOOL_RUNS, {},
      "--tools: fraction of responses with a void turn (a call with no code or expression, or an "
      "end, not at --max-tokens, with no answer and no code; --mask-void-turns leaves them out of "
      "the loss)"),
    M("tool/obs_tokens_mean", "", TOOL_RUNS, {},
      "--tools: mean tool-output tokens per response (response but not loss)"),
    M("train/thinking_cut_frac", "", GRPO, {},
      "--thinking-budget: fraction of responses still thinking at the budget (the close appended)"),
    # --- the learner
    M("train/epoch", GRPO, "", {}, "epoch within the rollout batch (--epochs-per-rollout-batch)"),
    M("train/ratio_mean", GRPO, "", {},
      "mean importance ratio pi / pi_old over response tokens (1 on-policy)"),
    M("train/ratio_min", GRPO, "", {},
      "smallest importance ratio pi / pi_old of the optimizer step"),
    M("train/ratio_max", GRPO, "", {},
      "largest importance ratio pi / pi_old of the optimizer step"),
    M("train/entropy_mask_frac", "", GRPO, {},
      "--entropy-top-quantile < 1: fraction of the step's response tokens that carried the policy-"
      "gradient loss"),
    M("train/logprob_mismatch", "", GRPO, {},
      "mean |log pi_trainer - log mu_engine| of the sampled tokens, on steps that score pi_old "
      "with a no-grad pass"),
    M("train/logprob_mismatch_multi_turn", "", GRPO, {},
      "--tools: train/logprob_mismatch over the rows with tool output inside"),
    M("train/logprob_mismatch_single_turn", "", GRPO, {},
      "--tools: train/logprob_mismatch over the rows without"),
    M("train/mismatch_kl", "", GRPO, {},
      "KL(mu || pi_old) on the engine's samples (k3): how off-policy they are"),
    M("train/is_weight_mean", "", GRPO, {},
      "mean rollout importance ratio pi_old / mu (per token or sequence)"),
    M("train/is_weight_min", "", GRPO, {}, "smallest rollout importance ratio pi_old / mu"),
    M("train/is_weight_max", "", GRPO, {}, "largest rollout importance ratio pi_old / mu"),
    M("train/is_weight_outside_frac", "", GRPO, {},
      "fraction of rollout importance ratios outside [0.5, 2]"),
    M("train/is_dropped_frac", "", GRPO, {},
      "fraction of response tokens --rollout-is mis weights 0"),
    M("train/mismatch_kernel_kl", "", "grpo_ray", {},
      "one-version-stale batches with --kl-every: KL(mu || pi_t-1), the engine-vs-trainer part of "
      "the mismatch"),
    M("train/mismatch_staleness_kl", "", "grpo_ray", {},
      "one-version-stale batches with --kl-every: KL(pi_t-1 || pi_t), the staleness part"),
    # --- validation (eval rows)
    M("eval/accuracy", "", f"{GRPO} expert_iteration sft", {},
      "greedy validation: fraction with answer reward 1 (the one meaning of accuracy)"),
    M("eval/accuracy_se", "", f"{GRPO} expert_iteration sft", {},
      "its standard error over questions (sample std / sqrt(n)); NaN with one question"),
    M("eval/n_questions", "", f"{GRPO} expert_iteration sft", {},
      "validation questions the eval row used"),
    M("eval/reward", "", f"{GRPO} expert_iteration sft", {}, "mean validation reward"),
    M("eval/format_reward", "", f"{GRPO} expert_iteration sft", {},
      "mean validation format reward"),
    M("eval/answer_reward", "", f"{GRPO} expert_iteration sft", {},
      "mean validation answer reward"),
    M("eval/response_len", "", f"{GRPO} expert_iteration sft", {},
      "mean validation response length (tokens; with --tools, the tokens the policy sampled)"),
    M("eval/truncation_rate", "", f"{GRPO} expert_iteration sft", {},
      "fraction of validation responses cut at the token limit"),
    M("eval/tool_calls_mean", "", TOOL_RUNS, {}, "--tools: mean tool calls per validation answer"),
    M("eval/avg@k", "", f"{GRPO} expert_iteration sft", {},
      "--eval-samples k: mean fraction of a question's k samples (at --eval-temperature) that are "
      "correct"),
    M("eval/avg@k_se", "", f"{GRPO} expert_iteration sft", {}, "its standard error over questions"),
    M("eval/pass@k", "", f"{GRPO} expert_iteration sft", {},
      "--eval-samples k: fraction of questions with a correct sample among the k "
      "(losses.pass_at_k)"),
    M("eval/pass@k_se", "", f"{GRPO} expert_iteration sft", {},
      "its standard error over questions"),
    M("eval/maj@k", "", f"{GRPO} expert_iteration sft", {},
      "--eval-samples k: the plurality answer of the k samples is correct (validation.maj_at_k)"),
    M("eval/maj@k_se", "", f"{GRPO} expert_iteration sft", {}, "its standard error over questions"),
    # --- time
    M("time/grading", f"{GRPO} expert_iteration", "", {}, "seconds grading the rollout batch"),
    M("time/tool", "", TOOL_RUNS, {},
      "--tools: seconds in tool calls during the rollout (not in time/generation)"),
    M("time/dynamic_extra_generation", "", GRPO, {},
      "--dynamic-sampling: seconds sampling after the first round"),
    M("time/entropy", "expert_iteration", "", {},
      "seconds of the no-grad pass that reads train/entropy"),
    M("time/old_log_probs", GRPO, "", {},
      "seconds of the no-grad passes (pi_old, reference, previous policy)"),
    M("time/weight_sync", f"{GRPO} expert_iteration", "sft", {},
      "seconds pushing weights into the engine (grpo: before this step; sft: before validation)"),
    M("time/step", f"{GRPO} expert_iteration sft", "", {},
      "seconds of the step with its weight sync, validation excluded (grpo_ray: since the previous"
      " logged step)"),
    M("time/gen_tokens_per_s", GRPO, "", {},
      "response tokens per second of generation (with --tools, the tokens the policy sampled)"),
    M("time/eval", "", f"{GRPO} expert_iteration sft", {}, "seconds of one validation"),
    M("time/wall", f"{GRPO} expert_iteration sft", "", {},
      "seconds since the run (or its resumed part) started"),
    # --- Ray
    M("ray/version", "grpo_ray", "", {}, "learner version after the update"),
    M("ray/gen_version", "grpo_ray", "", {}, "the version that generated the batch"),
    M("ray/lag", "grpo_ray", "", {},
      "how many versions the policy was ahead of the batch's generator when it trained on it"),
]
# fmt: on
KEYS = [m.key for m in METRICS]
GLOSSARY_START = "<!-- glossary: python metric_table.py --write -->"
GLOSSARY_END = "<!-- end of glossary -->"
DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs", "metrics.md")


def logged_by(metric):
    """The scripts that log `metric` (every row or some)."""
    return (metric.every + " " + metric.some).split()


def step_keys(script):
    """The keys every step row of `script` has, in table order."""
    return [m.key for m in METRICS if script in m.every.split()]


def some_keys(script):
    """The keys `script` logs on some rows only, in table order."""
    return [m.key for m in METRICS if script in m.some.split()]


def tool_keys(script):
    """The keys `script` logs in --tools runs only (their meaning opens with "--tools:")."""
    return [m.key for m in METRICS if script in logged_by(m) and m.meaning.startswith("--tools:")]


def step_line(script, head, row):
    """`script`'s console line of a metrics row: head, then each metric the script shows that the
    row has, as "name value" (the key without its namespace), "|"-separated."""
    parts = [head]
    for m in METRICS:
        fmt = m.line.get(script)
        if fmt is not None and m.key in row:
            parts.append(f"{m.key.split('/')[-1]} {row[m.key]:{fmt}}")
    return " | ".join(parts)


def glossary():
    """docs/metrics.md's glossary table (markdown), one row per metric."""
    lines = ["| key | logged by | meaning |", "|---|---|---|"]
    for m in METRICS:
        lines.append(f"| `{m.key}` | {', '.join(logged_by(m))} | {m.meaning} |")
    return "\n".join(lines)


def glossary_span(path=DOC):
    """(docs/metrics.md's text, where its glossary starts, where it ends): between its markers."""
    with open(path) as f:
        text = f.read()
    start = text.index(GLOSSARY_START) + len(GLOSSARY_START)
    return text, start, text.index(GLOSSARY_END)


def documented_glossary(path=DOC):
    """The glossary table as docs/metrics.md has it."""
    text, start, end = glossary_span(path)
    return text[start:end].strip()


def write_glossary(path=DOC):
    """Rewrite docs/metrics.md's glossary table from METRICS."""
    text, start, end = glossary_span(path)
    with open(path, "w") as f:
        f.write(text[:start] + "\n" + glossary() + "\n" + text[end:])


def check():
    """Problems with the table itself: a duplicate key, an unknown script, a line format for a
    script that does not log the metric."""
    problems = []
    if len(set(KEYS)) != len(KEYS):
        problems.append("a key is listed twice")
    for m in METRICS:
        for script in logged_by(m) + list(m.line):
            if script not in SCRIPTS:
                problems.append(f"{m.key}: unknown script {script!r}")
        for script in m.line:
            if script not in logged_by(m):
                problems.append(f"{m.key}: on {script}'s line but not logged by it")
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(description="Print, or write into docs/metrics.md, the glossary.")
    p.add_argument("--write", action="store_true", help="rewrite docs/metrics.md's table")
    if p.parse_args(argv).write:
        write_glossary()
        print(f"wrote the glossary of {len(METRICS)} metrics into {DOC}")
    else:
        print(glossary())


if __name__ == "__main__":
    main()
