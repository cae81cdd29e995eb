"""Validation: what every trainer and evaluator reports about a model's answers.

- `greedy_eval`: one greedy answer per question, graded -> eval/accuracy (answer reward 1) and
  its standard error, eval/reward, eval/response_len, ... (every trainer logs it);
- `sampled_eval` (--eval-samples k, --eval-temperature T): k samples per question ->
  eval/avg@k, eval/pass@k, eval/maj@k and their `_se` (`sampled_metrics`);
- `answer`: a response's normalised final answer, what maj@k votes with; `maj_at_k`: the exact
  expected correctness of the plurality answer of a random k-subset. pass@k is losses.pass_at_k,
  the one unbiased estimator (Chen et al.).

best_of_n.py and eval_zero_shot.py use the same functions, so a number means the same everywhere.
"""

import math
import re
from collections import Counter
from fractions import Fraction
from math import comb

from common import nonneg_int, positive_float
from grader import last_boxed


# ----------------------------------------------------------------------------- validation
def greedy_eval(
    engine, rows, reward, max_tokens, min_tokens=0, workers=None, tool=None, thinking=None
):
    """The validation every trainer logs: greedy answers to the rows' prompts (stopped at their
    "stop" strings) on the engine's weights, graded -> (eval/ metrics, sample rows).
    eval/accuracy is the fraction with answer reward 1, in every script. With a tool (tools.Tool)
    the answers use it, the policy's own text is graded and a sample row shows the transcript.
    With a thinking budget (tools.Thinking) the answers keep to it."""
    import grader

    generations = answers_of(
        engine, rows, 1, 0.0, max_tokens, min_tokens, tool=tool, thinking=thinking
    )
    outs = [samples[0] for samples in generations]  # n=1: one sample per prompt
    texts = [o.get("policy_text", o["text"]) for o in outs]
    gts = [r["ground_truth"] for r in rows]
    dicts = grader.grade_batch(grader.REWARD_FNS[reward], texts, gts, workers=workers)

    n = max(len(outs), 1)
    metrics = {}
    for k in ("reward", "format_reward", "answer_reward"):
        metrics[f"eval/{k}"] = sum(d[k] for d in dicts) / n
    correct = []  # per question: 1 when its answer reward is 1
    for d in dicts:
        correct.append(int(grader.is_correct(d)))
    metrics["eval/accuracy"], metrics["eval/accuracy_se"] = mean_se(correct)
    metrics["eval/n_questions"] = len(rows)
    lengths = [len(o["token_ids"]) for o in outs]
    if tool is not None or thinking is not None:
        lengths = [sum(o["policy_mask"]) for o in outs]  # the tokens sampled, as in training
    metrics["eval/response_len"] = sum(lengths) / n
    truncated = [o["finish_reason"] in ("length", "truncated_by_tool") for o in outs]
    metrics["eval/truncation_rate"] = sum(truncated) / n
    if tool is not None:
        metrics["eval/tool_calls_mean"] = sum(o["calls"] for o in outs) / n

    samples = []
    for r, o, g, d in zip(rows, outs, gts, dicts):
        samples.append(
            {"split": "eval", "prompt": r["prompt"], "response": o["text"], "ground_truth": g, **d}
        )
    return metrics, samples


def answers_of(
    engine, rows, n, temperature, max_tokens, min_tokens, seed=None, tool=None, thinking=None
):
    """rollout.generate's n samples for each row's prompt, stopped at the rows' "stop" strings;
    with a tool, tools.generate's; with a thinking budget, tools.generate_thinking's."""
    import rollout
    import tools

    stop = []
    if rows:
        stop = rows[0]["stop"]
    prompts = [r["prompt"] for r in rows]
    sampling = {
        "n": n,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "stop": stop,
        "seed": seed,
    }
    if tool is not None:
        return tools.generate(engine, prompts, tool, **sampling)
    if thinking is not None:
        return tools.generate_thinking(engine, prompts, thinking, **sampling)
    return rollout.generate(engine, prompts, **sampling)


def mean_se(values):
    """(mean, standard error of the mean) of per-question values: the sample standard deviation
    (n - 1) / sqrt(n), the error bar every eval metric carries. One value: SE NaN (unknown)."""
    n = len(values)
    if n == 0:
        return 0.0, float("nan")
    mean = sum(values) / n
    if n == 1:
        return float(mean), float("nan")
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return float(mean), math.sqrt(variance / n)


def sampled_metrics(correct, answers, k):
    """eval/avg@k, eval/pass@k, eval/maj@k and their `_se` (over questions), from k graded
    samples per question. correct, answers: per question, k flags and k normalised answers
    (`answer`; None = no answer). avg@k = the fraction of a question's samples that are
    right; pass@k is losses.pass_at_k (Chen et al.'s unbiased estimator; at n = k, "any sample
    right") and maj@k `maj_at_k` (the plurality answer, ties split)."""
    from losses import pass_at_k  # here, not at the top: eval_zero_shot.py --help loads no torch

    per_question = {"avg@k": [], "pass@k": [], "maj@k": []}
    for flags, votes in zip(correct, answers):
        c = sum(flags)
        per_question["avg@k"].append(c / len(flags))
        per_question["pass@k"].append(float(pass_at_k(len(flags), c, k)))
        per_question["maj@k"].append(float(maj_at_k(votes, flags, k)))
    metrics = {}
    for name, values in per_question.items():
        metrics[f"eval/{name}"], metrics[f"eval/{name}_se"] = mean_se(values)
    return metrics


def sampled_eval(
    engine,
    rows,
    reward,
    k,
    temperature,
    max_tokens,
    min_tokens=0,
    workers=None,
    seed=0,
    tool=None,
    thinking=None,
):
    """Sampled validation (--eval-samples k, --eval-temperature T): k samples per question at T,
    graded -> sampled_metrics' eval/ keys. The same seeds at every evaluation (sample j of question
    i uses seed + j * len(rows) + i), so two steps differ by their weights, not their draws."""
    import grader

    generations = answers_of(
        engine, rows, k, temperature, max_tokens, min_tokens, seed, tool, thinking
    )
    texts = []
    gts = []
    for r, samples in zip(rows, generations):
        for o in samples:
            texts.append(o.get("policy_text", o["text"]))  # with a tool: the policy's own text
            gts.append(r["ground_truth"])
    dicts = grader.grade_batch(grader.REWARD_FNS[reward], texts, gts, workers=workers)
    correct = []  # per question: its k samples' flags, then their answers
    answers = []
    for i in range(len(rows)):
        graded = dicts[i * k : (i + 1) * k]
        correct.append([grader.is_correct(d) for d in graded])
        answers.append([answer(t) for t in texts[i * k : (i + 1) * k]])
    return sampled_metrics(correct, answers, k)


def eval_sampling_flags(g):
    """--eval-samples and --eval-temperature, in a trainer's eval group (grpo.py, grpo_ray.py,
    sft.py, expert_iteration.py)."""
    g.add_argument(
        "--eval-samples",
        type=nonneg_int,
        default=0,
        help="sampled validation: k samples per question -> eval/avg@k, pass@k, maj@k (0 = off)",
    )
    g.add_argument(
        "--eval-temperature",
        type=positive_float,
        default=1.0,
        help="temperature of the --eval-samples samples (seed 001 evaluates GSM8K at 1.0)",
    )


# ----------------------------------------------------------------------------- maj@k
def maj_at_k(answers, correct, k):
    """Expected correctness of the plurality answer of a random k-subset (answers: str or None)."""
    n = len(answers)
    m0 = len([a for a in answers if a is None])  # samples with no answer: they do not vote
    size = Counter(a for a in answers if a is not None)  # answer -> samples carrying it
    good = {a for a, ok in zip(answers, correct) if ok and a is not None}
    total = Fraction(0)
    for g in good:
        others = [m for a, m in size.items() if a != g]
        for x in range(1, min(k, size[g]) + 1):  # g gets x votes; every other answer gets <= x
            # (votes drawn from other answers, how many of those answers tie g at x) -> count
            ways = {(0, 0): 1}
            for m in others:
                nxt = {}
                for (s, t), w in ways.items():
                    for y in range(0, min(m, x, k - x - s) + 1):  # this answer gets y votes
                        ties = t
                        if y == x:
                            ties = t + 1
                        key = (s + y, ties)
                        nxt[key] = nxt.get(key, 0) + w * comb(m, y)
                ways = nxt
            # the rest of the subset comes from answer-less samples; g tied with t other answers
            # wins 1 / (t + 1) of the time
            for (s, t), w in ways.items():
                total += Fraction(comb(size[g], x) * w * comb(m0, k - x - s), t + 1)
    return total / comb(n, k)


def answer(text):
    """Normalised final answer: last <answer>...</answer> (a \\boxed{} in it unwrapped), else last
    \\boxed{}; None if neither.
    Spaces, $ and a trailing period are dropped; numbers are canonicalised (1,000.0 -> 1000);
    Countdown expressions vote as strings, so "3+4" and "4+3" are different answers."""
    tags = re.findall(r"<answer>(.*?)</answer>", text, re.S)
    a = tags[-1] if tags else last_boxed(text)
    if a is None:
        return None
    a = last_boxed(a) or a  # "<answer> \boxed{72} </answer>" votes with "<answer> 72 </answer>"
    a = re.sub(r"\s+|\$", "", a).rstrip(".")
    try:
        v = float(a.replace(",", ""))
        return str(int(v)) if v.is_integer() else repr(v)
    except (ValueError, OverflowError):
        return a or None
