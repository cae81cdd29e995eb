"""Tool use: the tools a policy calls mid-response (python, calculator) and the multi-turn rollout.

A turn ends at the task's stop (</answer>, EOS) or at the prompt's trigger (the prompt file's
header, read by data.py: `# trigger:` and `# output:`). At a trigger the tool runs on the turn's
text; its output (or the exception's last line, or TimeoutError), middle-truncated to
--max-obs-tokens and put in the header's output format, is appended as tokens *after the engine's
last token id* (which may run past the trigger text: ids are never trimmed to match text), and the
next turn continues from the prompt's ids and every segment's ids as they are. Token ids are never
re-tokenised from text.

Each sample carries a policy mask over its response tokens: 1 on the tokens the engine sampled (the
trigger and EOS included), 0 on tool output, whose log-probs read 0. Its text comes twice:
"policy_text", the policy's own segments (what is graded: a tool that prints <answer> earns
nothing), and "text", the transcript with the tool output.

- python: runs the turn's last ```python block in sandbox.py's sandbox, on the run's pool; the
  output is its stdout (and the exception's last line, if it raised), without trailing newlines.
- calculator: evaluates the arithmetic expression written out before the trigger in this turn
  (numbers, + - * /, brackets) in this process, exactly (fractions of the decimals written): an
  AST walk over numbers runs no code, so it needs no sandbox.

Budget: --max-tokens counts every response token, tool output included. An observation that
leaves no room for one more sampled token ends the sample ("truncated_by_tool") instead of being
cut (when no output could fit, the tool does not run at all); a turn cut by
its length ends the sample, and its partial code never runs. After
--max-tool-calls K calls the trigger is no longer a stop: a (K+1)-th trigger is sampled and
trained on, not run.

Seeds: turn t of sample j of prompt i uses seed + t * turn_stride + j * P + i (P prompts), fixed by
(prompt, sample, turn), not by a sample's place among those still running. Turn 0 is
rollout.generate's own call, so a response that never calls a tool is the one it samples.

A thinking budget (--thinking-budget N, Qwen3's) is the same structure with a fixed insertion:
`generate_thinking` samples N tokens; a response still thinking then (no </think> in its text)
gets the thinking's close appended (mask 0, log-prob 0; only the tag's rest when the cut fell
inside it), and a second turn, seeded as turn 1 above, continues from the ids as they are; a stop
string the cut split ends that turn where one call would have ended. It does not combine with
--tools.
"""

import ast
import operator
import os
import re
import time
from fractions import Fraction
from typing import NamedTuple

import common
import data
import grader
import sandbox

TOOLS = ("python", "calculator")  # --tools choices
MAX_CALLS = {"python": 1, "calculator": 8}  # --max-tool-calls defaults (ToRL's C = 1 for python)
TRUNCATION_MARK = " ... "  # between an output's head and tail when it is cut


# ----------------------------------------------------------------------------- the tools
class Tool:
    """One run's tool: its name, the prompt's trigger and output format, the call limit, the
    observation cap in tokens, and (python) the sandbox pool its calls run on. `seconds` counts
    the time spent in calls."""

    def __init__(self, name, trigger, output, max_calls, max_obs_tokens, pool=None):
        if name not in TOOLS:
            raise ValueError(f"unknown tool {name!r}; choose from {TOOLS}")
        self.name = name
        self.trigger = trigger
        self.output = output
        self.max_calls = max_calls
        self.max_obs_tokens = max_obs_tokens
        self.pool = pool
        self.seconds = 0.0

    def run(self, turn_texts):
        """Each turn's text (ending with the trigger) -> [(output, status)], status "ok", "error",
        "timeout", or "void" for a call with nothing to run (no code, no expression)."""
        t0 = time.perf_counter()
        results = [None] * len(turn_texts)
        if self.name == "calculator":
            for k, text in enumerate(turn_texts):
                expression = expression_before(text, self.trigger)
                results[k] = calculate(expression)
                if not expression:
                    results[k] = (results[k][0], "void")
        elif self.name == "python":
            codes = []  # (index, code) of the turns with a code block
            for k, text in enumerate(turn_texts):
                code = last_code_block(text)
                if code is None:
                    results[k] = ("SyntaxError: no ```python code block before the call", "void")
                else:
                    codes.append((k, code))
            outs = self.pool.run([code for _, code in codes])
            for (k, _), out in zip(codes, outs):
                # the output format places it: an error line and a print end alike
                results[k] = (out["output"].rstrip("\n"), out["status"])
        else:
            raise ValueError(f"tool {self.name!r} has no call in Tool.run")
        self.seconds += time.perf_counter() - t0
        return results

    def close(self):
        """Stop the sandbox workers of python's pool (a calculator has none)."""
        if self.pool is not None:
            self.pool.close()


CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def last_code_block(text):
    """The last fenced code block's code in text (```python, ```py or a bare ```), or None."""
    blocks = CODE_BLOCK.findall(text)
    if not blocks:
        return None
    return blocks[-1]


# the arithmetic the calculator reads: from a digit, bracket or minus sign to the trigger
EXPRESSION = re.compile(r"[-(0-9][-+*/(). 0-9]*$")
MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 10**15  # a larger intermediate value is an error, not a number to print
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def expression_before(text, trigger):
    """The arithmetic right before the trigger that ends text ("" when there is none): "no. 5 * 2
    =" -> "5 * 2". Read from the last 2 x MAX_EXPRESSION_CHARS characters: a longer one is
    refused by `calculate`, never cut to a different expression."""
    if text.endswith(trigger):
        text = text[: len(text) - len(trigger)]
    match = EXPRESSION.search(text[-2 * MAX_EXPRESSION_CHARS :])
    if match is None:
        return ""
    return match[0].strip()


def calculate(expression):
    """(output, status) of an arithmetic expression: the exact value (an integer, or rounded to
    6 decimals), or the error's one line."""
    if not expression:
        return "SyntaxError: no expression before the call", "error"
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"ValueError: expression over {MAX_EXPRESSION_CHARS} characters", "error"
    try:
        value = _value(ast.parse(expression, mode="eval").body)
    except SyntaxError:
        return "SyntaxError: invalid syntax", "error"
    except ZeroDivisionError:
        return "ZeroDivisionError: division by zero", "error"
    except ValueError as err:
        return f"ValueError: {err}", "error"
    if value.denominator == 1:
        return str(value.numerator), "ok"
    rounded = f"{float(value):.6f}".rstrip("0")  # 6 decimals, as the expression reads them back
    if rounded in ("0.", "-0."):
        return f"{float(value):.6g}", "ok"  # too small for 6 decimals
    return rounded.rstrip("."), "ok"


def _value(node):
    """The exact value of a parsed expression of numbers, + - * / and brackets."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = Fraction(str(node.value))  # 0.1 is 1/10, not the float nearest it
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand)
        if isinstance(node.op, ast.USub):
            value = -value
    elif isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left = _value(node.left)
        right = _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ZeroDivisionError
        value = OPERATORS[type(node.op)](left, right)
    else:
        raise ValueError("only numbers, + - * / and brackets")
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError("number too large")
    return value


# ----------------------------------------------------------------------------- observations
def middle(text, n_chars):
    """text cut to about n_chars characters: its head and tail around TRUNCATION_MARK."""
    if len(text) <= n_chars:
        return text
    head = (n_chars + 1) // 2
    tail = n_chars // 2
    return text[:head] + TRUNCATION_MARK + text[len(text) - tail :]


def observation(tool, output, tokenizer):
    """(token ids, text) of a tool output in the prompt's output format, the output
    middle-truncated until the whole fits in tool.max_obs_tokens tokens. The output is cut in
    characters first (8 per allowed token) so a 10 MB print is never tokenised."""
    n_chars = 8 * tool.max_obs_tokens
    while True:
        text = tool.output.replace("{}", middle(output, n_chars))
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) <= tool.max_obs_tokens:
            return ids, text
        if n_chars == 0:  # the output format alone is over the cap: cut, and shown as cut
            ids = ids[: tool.max_obs_tokens]
            return ids, tokenizer.decode(ids)
        n_chars = min(n_chars - 1, n_chars * tool.max_obs_tokens // len(ids))


# ----------------------------------------------------------------------------- the flags
# Every script that samples (grpo.py, grpo_ray.py, expert_iteration.py, eval_zero_shot.py,
# best_of_n.py) takes these flags, reads them in its resolve through `resolve` and
# `isolated`, and builds its run's tool with `make`.
def add_flags(p):
    """The "tools" flag group (off by default) -> the group (grpo.py adds its training flags)."""
    g = p.add_argument_group("tools")  # --- tools ---
    g.add_argument(
        "--tools",
        choices=TOOLS,
        default=None,
        help="a tool the policy calls mid-response (default: none); the prompt's header declares "
        "its trigger (default prompt: the task's, with _<tool> appended)",
    )
    g.add_argument(
        "--max-tool-calls",
        type=common.positive_int,
        default=None,
        help=f"tool calls per response (ToRL's C); default {MAX_CALLS}",
    )
    g.add_argument(
        "--max-obs-tokens",
        type=common.positive_int,
        default=256,
        help="a tool output's cap in tokens (middle-truncated); it counts in --max-tokens",
    )
    g.add_argument(
        "--tool-timeout",
        type=common.positive_float,
        default=None,
        help="seconds per python call; default 10 for math and math500, 3 otherwise",
    )
    g.add_argument(
        "--tool-workers",
        type=common.positive_int,
        default=8,
        help="python calls run at once (the run's sandbox pool)",
    )
    g.add_argument(
        "--tool-sandbox",
        choices=("bwrap", "none"),
        default="bwrap",
        help="python calls run in bubblewrap (sandbox.py); none: rlimits and an audit hook only, "
        "which hostile code can escape (on purpose only)",
    )
    g.add_argument(
        "--thinking-budget",
        type=common.positive_int,
        default=None,
        help="thinking models: a response still thinking after N tokens gets </think> appended "
        "(no loss) and answers in the rest of --max-tokens (default: no budget)",
    )
    return g


def resolve(args, task):
    """The tool flags' defaults and checks, before anything loads, each a one-line error: the
    prompt (unset: the task's, data.task_defaults' `task["prompt"]`, with _<tool> appended under
    --tools), the call limit by tool, the python timeout by task; a prompt that declares a trigger
    needs --tools and --tools needs one; --thinking-budget's (check_thinking, with --reward or the
    task's)."""
    task_prompt = task["prompt"]
    if args.prompt is None:
        args.prompt = task_prompt
        if args.tools:
            args.prompt = f"{task_prompt}_{args.tools}"  # e.g. r1_zero_calculator
            common.check(
                os.path.exists(os.path.join(data.PROMPTS_DIR, f"{args.prompt}.prompt")),
                f"--tools {args.tools}: no prompts/{args.prompt}.prompt for --task {args.task}: "
                "pass --prompt NAME, a prompt whose header declares the trigger (docs/tools.md)",
            )
    header = common.attempt(data.prompt_header, args.prompt, what=f"--prompt {args.prompt}")
    check_thinking(args, args.reward or task["reward"])
    if not args.tools:
        common.check(
            args.max_tool_calls is None and args.tool_timeout is None,
            "--max-tool-calls and --tool-timeout need --tools",
        )
        common.check(
            not header,
            f"prompts/{args.prompt}.prompt declares a tool trigger: pass --tools, or a prompt "
            "without a header",
        )
        return
    common.check(
        bool(header),
        f"--tools {args.tools} needs a prompt that declares its trigger: --prompt NAME, where "
        f'prompts/NAME.prompt opens with `# trigger: "..."` and `# output: "... {{}} ..."`',
    )
    common.check(args.max_obs_tokens >= 8, "--max-obs-tokens must be >= 8")
    if args.max_tool_calls is None:
        args.max_tool_calls = MAX_CALLS[args.tools]
    if args.tool_timeout is None:
        args.tool_timeout = 3.0
        if args.task in ("math", "math500"):
            args.tool_timeout = 10.0


def check_thinking(args, reward):
    """--thinking-budget's checks, each a one-line error: a prompt that opens <think> (r1_zero) or
    the model's chat template with thinking on (Qwen3 opens <think> itself), and no tool (a turn
    ends at a trigger or at the budget: the loop has one kind of turn). Not the r1_zero reward
    (`reward`, the run's) under --chat-template on: the chat's close (THINKING_END) ends in a blank
    line, not r1_zero's "</think> <answer>", so no cut response could earn its format reward."""
    if args.thinking_budget is None:
        return
    common.check(not args.tools, "--thinking-budget does not combine with --tools: drop one")
    chat = getattr(args, "chat_template", "off")  # expert_iteration.py takes no --chat-template
    common.check(
        chat != "no_thinking",
        "--thinking-budget with --chat-template no_thinking: the model does not think; pass "
        "--chat-template on, or drop --thinking-budget",
    )
    common.check(
        chat == "on" or "<think>" in data.load_prompt(args.prompt),
        f"--thinking-budget: prompts/{args.prompt}.prompt opens no <think>: pass a prompt that "
        "does (--prompt r1_zero), or --chat-template on with a thinking model (Qwen3)",
    )
    common.check(
        chat != "on" or reward != "r1_zero",
        f"--thinking-budget with --chat-template on closes a thinking with {THINKING_END['chat']!r}"
        f", which --reward r1_zero never grades as formatted (it needs {grader.R1_ZERO_TAGS!r}): "
        "pass a boxed-answer task (--task math) or --reward question_only",
    )


def isolated(args):
    """Whether python calls run under bubblewrap: yes, unless --tool-sandbox none says so on
    purpose; one line now if bubblewrap does not work here (one probe call: each script's
    resolve asks last, after the cheap checks)."""
    return args.tools == "python" and sandbox.isolation(args.tool_sandbox)


def make(args):
    """The run's Tool (--tools), else None. python's calls run on one sandbox pool per run
    (close it with tool.close())."""
    if not args.tools:
        return None
    header = data.prompt_header(args.prompt)
    pool = None
    if args.tools == "python":
        pool = sandbox.ToolPool(
            args.tool_workers,
            args.tool_timeout,
            args.tool_isolated,
            max_chars=8 * args.max_obs_tokens,
        )
    return Tool(
        args.tools,
        header["trigger"],
        header["output"],
        args.max_tool_calls,
        args.max_obs_tokens,
        pool,
    )


# ----------------------------------------------------------------------------- the multi-turn loop
def generate(
    llm,
    prompts,
    tool,
    n=1,
    temperature=1.0,
    top_p=1.0,
    max_tokens=256,
    min_tokens=0,
    stop=None,
    seed=None,
    turn_stride=None,
):
    """rollout.generate with the tool in the loop (module docstring) -> per prompt, n dicts:
    rollout.generate's keys over the whole response ("text" the transcript; "logprobs" 0 on tool
    output; "finish_reason" also "truncated_by_tool"), plus "policy_mask", "policy_text", "calls",
    "errors", "timeouts", "turns", "obs_tokens", "void" (SimpleTIR's void turn: a trigger with
    nothing to run, or an end with no answer and no code; "errors" counts neither) and
    "segments", the transcript turn by turn: [{"policy": text} or {"tool": text, "status"}], whose
    texts join to "text". min_tokens bans stop tokens in the first turn only; turn_stride (default
    n x prompts) spaces the turns' seeds."""
    # imported here, not at the top: rollout loads torch (~2 s), and the scripts that read
    # add_flags at parse time (eval_zero_shot.py) give their one-line errors before that
    import rollout

    stop = list(stop or [])
    P = len(prompts)
    if turn_stride is None:
        turn_stride = n * P
    tokenizer = rollout.engine_tokenizer(llm)
    min_obs = int(tool.output != "{}")  # the fewest tokens an observation takes
    samples = []  # sample j of prompt i at i * n + j
    for i in range(P):
        for j in range(n):
            samples.append(_new_sample(i, j))
    active = list(samples)  # the samples whose next turn is sampled now
    turn = 0
    while active:
        calls_left = tool.max_calls - turn  # every active sample has made `turn` calls
        turn_stop = list(stop)
        if calls_left > 0:
            turn_stop.append(tool.trigger)
        sampling = {
            "temperature": temperature,
            "top_p": top_p,
            "stop": turn_stop,
        }
        if turn == 0:
            outs = rollout.generate(
                llm,
                prompts,
                n=n,
                max_tokens=max_tokens,
                min_tokens=min_tokens,
                seed=seed,
                **sampling,
            )
            outs = [o for samples_of_prompt in outs for o in samples_of_prompt]
        else:
            outs = _continue(llm, active, turn, sampling, max_tokens, seed, turn_stride, P)
        calling = []
        for s, out in zip(active, outs):
            if turn == 0:
                s["prompt_token_ids"] = out["prompt_token_ids"]
            called = calls_left > 0 and out["stop_reason"] == tool.trigger
            _add_turn(s, out, tokenizer, called)
            if not called:
                s["finish_reason"] = out["finish_reason"]  # the task's stop, EOS or the length
                s["stop_reason"] = out["stop_reason"]
                s["void"] = s["void"] or void_end(s["policy_text"], out)
            elif len(s["token_ids"]) + min_obs >= max_tokens:
                # no output could fit with room for one more sampled token: nothing runs
                s["finish_reason"] = "truncated_by_tool"
            else:
                calling.append(s)  # finished by the trigger: the tool runs
        active = _run_tool(tool, calling, tokenizer, max_tokens)
        turn += 1
    per_prompt = []
    for i in range(P):
        per_prompt.append(samples[i * n : (i + 1) * n])
    for s in samples:
        del s["i"], s["j"], s["turn_text"]
    return per_prompt


def _run_tool(tool, calling, tokenizer, max_tokens):
    """The tool phase of a turn: the tool answers each calling sample's turn, and its output goes
    in as an observation (mask 0, log-prob 0). -> the samples that go on to the next turn; one
    whose observation leaves no room for a sampled token ends as "truncated_by_tool"."""
    outputs = tool.run([s["turn_text"] for s in calling])
    active = []
    for s, (output, status) in zip(calling, outputs):
        s["calls"] += 1  # the triggers the tool answered
        s["errors"] += status in ("error", "timeout")
        s["timeouts"] += status == "timeout"
        if status == "void":
            s["void"] = True  # a trigger with nothing to run
        ids, text = observation(tool, output, tokenizer)
        if len(s["token_ids"]) + len(ids) >= max_tokens:
            s["finish_reason"] = "truncated_by_tool"  # no room left for a sampled token
            continue
        s["token_ids"] += ids
        s["logprobs"] += [0.0] * len(ids)
        s["policy_mask"] += [0] * len(ids)
        s["text"] += text
        s["segments"].append({"tool": text, "status": status})
        s["obs_tokens"] += len(ids)
        active.append(s)
    return active


def void_end(policy_text, last):
    """SimpleTIR's void end: a response that ends (not cut at its length: that is
    --mask-truncated's) with no answer anywhere in its policy text and no code in its last turn."""
    answered = "</answer>" in policy_text or "\\boxed" in policy_text
    ended = last["finish_reason"] != "length"
    return ended and not answered and last_code_block(last["text"]) is None


def _continue(llm, active, turn, sampling, max_tokens, seed, turn_stride, P):
    """Turn `turn` (> 0) of the active samples: each continues the prompt's ids and its
    segments' ids, with the budget it has left and its own seed (none when seed is None)."""
    import rollout

    contexts = []
    budgets = []
    seeds = None
    if seed is not None:
        seeds = []
    for s in active:
        contexts.append(s["prompt_token_ids"] + s["token_ids"])
        budgets.append(max_tokens - len(s["token_ids"]))
        if seed is not None:
            seeds.append(seed + turn * turn_stride + s["j"] * P + s["i"])
    outs = rollout.generate(llm, contexts, max_tokens=budgets, seeds=seeds, **sampling)
    return [o[0] for o in outs]


def _new_sample(i, j):
    return {
        "i": i,
        "j": j,
        "prompt_token_ids": [],
        "token_ids": [],
        "logprobs": [],
        "policy_mask": [],
        "text": "",
        "policy_text": "",
        "turn_text": "",
        "finish_reason": None,
        "stop_reason": None,
        "calls": 0,
        "void": False,
        "errors": 0,
        "timeouts": 0,
        "turns": 0,
        "obs_tokens": 0,
        "segments": [],
    }


def _add_turn(sample, out, tokenizer, called):
    """Append a turn the engine sampled: its ids and log-probs as they are, mask 1. The engine's
    text ends at the stop string (the turn's text the tool reads); a turn that calls the tool
    joins the sample's text as its ids decode, the characters of its last token past the trigger
    included, so the transcript and the graded text are what the model saw."""
    text = out["text"]
    if called:
        # decoded after a few ids of its context, as the engine's detokenizer does (a
        # SentencePiece tokenizer drops a segment's leading space when it decodes it alone)
        context = (sample["prompt_token_ids"] + sample["token_ids"])[-6:]
        whole = tokenizer.decode(context + out["token_ids"], skip_special_tokens=True)
        decoded = whole[len(tokenizer.decode(context, skip_special_tokens=True)) :]
        if decoded.startswith(text):  # else the engine's own text
            text = decoded
    sample["token_ids"] += out["token_ids"]
    sample["logprobs"] += out["logprobs"]
    sample["policy_mask"] += [1] * len(out["token_ids"])
    sample["text"] += text
    sample["policy_text"] += text
    sample["segments"].append({"policy": text})
    sample["turn_text"] = out["text"]
    sample["turns"] += 1


# ----------------------------------------------------------------------------- the thinking budget
# What --thinking-budget appends, as each format closes its thinking: Qwen3's chat template
# ("<think>\n...\n</think>\n\n"), and a raw prompt's (r1_zero: "<think> ... </think> <answer>")
THINKING_END = {"chat": "\n</think>\n\n", "prompt": " </think>"}


class Thinking(NamedTuple):
    budget: int  # tokens a response may think (sampled tokens before its </think>)
    end: str  # the text appended to a response still thinking at the budget


def thinking(args):
    """The run's Thinking (--thinking-budget), else None. The appended close is the chat
    template's under --chat-template on, else the prompt's."""
    if args.thinking_budget is None:
        return None
    end = THINKING_END["prompt"]
    if getattr(args, "chat_template", "off") == "on":  # expert_iteration.py takes none
        end = THINKING_END["chat"]
    return Thinking(args.thinking_budget, end)


def generate_thinking(
    llm,
    prompts,
    thinking,
    n=1,
    temperature=1.0,
    top_p=1.0,
    max_tokens=256,
    min_tokens=0,
    stop=None,
    seed=None,
    turn_stride=None,
):
    """rollout.generate with a thinking budget (module docstring) -> per prompt, n dicts:
    rollout.generate's keys over the whole response, plus "policy_mask" (0 on the appended close,
    whose log-probs read 0), "policy_text" (what is graded: the whole text, the close included:
    it is the format's tag, the answer is the policy's), "segments" ([{"policy": text} or
    {"appended": text}], joining to "text"), "turns" and "thinking_cut" (the budget closed the
    thinking). Turn 0 is rollout.generate's own call with at most thinking.budget tokens: a
    response that ends in it is the one rollout.generate samples. One cut there goes on in a
    second turn (seed + turn_stride + j * P + i) with the rest of max_tokens, which counts the
    close too (close_rest: only the tag's rest after a cut inside it); one that closed its
    thinking itself goes on with nothing appended. A stop string that begins in turn 0 and ends in
    turn 1 ends the response there (stop_across), as one call would have."""
    import rollout

    P = len(prompts)
    if turn_stride is None:
        turn_stride = n * P
    tokenizer = rollout.engine_tokenizer(llm)
    first = min(thinking.budget, max_tokens)  # turn 0: the thinking's tokens
    sampling = {"temperature": temperature, "top_p": top_p, "stop": list(stop or [])}
    outs = rollout.generate(
        llm, prompts, n=n, max_tokens=first, min_tokens=min_tokens, seed=seed, **sampling
    )
    samples = []  # sample j of prompt i at i * n + j
    going = []  # the samples cut at the budget: their second turn is sampled
    for i in range(P):
        for j in range(n):
            out = outs[i][j]
            s = _new_sample(i, j)
            s["prompt_token_ids"] = out["prompt_token_ids"]
            s["thinking_cut"] = False
            _add_turn(s, out, tokenizer, called=False)
            s["finish_reason"] = out["finish_reason"]
            s["stop_reason"] = out["stop_reason"]
            samples.append(s)
            if out["finish_reason"] != "length" or first == max_tokens:
                continue  # it ended inside the budget, or at --max-tokens
            if "</think>" not in s["text"]:
                end = close_rest(s["text"], thinking.end)
                end_ids = tokenizer(end, add_special_tokens=False).input_ids
                if len(s["token_ids"]) + len(end_ids) >= max_tokens:
                    continue  # no room for the close and one more sampled token: cut as it is
                s["token_ids"] += end_ids
                s["logprobs"] += [0.0] * len(end_ids)
                s["policy_mask"] += [0] * len(end_ids)
                s["text"] += end
                s["policy_text"] += end
                s["segments"].append({"appended": end})
                s["thinking_cut"] = True
            going.append(s)
    outs = _continue(llm, going, 1, sampling, max_tokens, seed, turn_stride, P)
    for s, out in zip(going, outs):
        context = (s["prompt_token_ids"] + s["token_ids"])[-6:]
        out = stop_across(s["text"], out, sampling["stop"], tokenizer, context)
        _add_turn(s, out, tokenizer, called=False)
        s["finish_reason"] = out["finish_reason"]
        s["stop_reason"] = out["stop_reason"]
    for s in samples:
        for key in ("i", "j", "turn_text", "calls", "void", "errors", "timeouts", "obs_tokens"):
            del s[key]  # the tool loop's
    per_prompt = []
    for i in range(P):
        per_prompt.append(samples[i * n : (i + 1) * n])
    return per_prompt


def close_rest(text, end):
    """What of the close `end` a response still thinking gets: all of it, or, when its text stops
    inside the tag ("... </" up to "... </think"), only the tag's rest and what follows it. A
    lone "<" is left alone: in a thinking it is more likely a comparison than a tag."""
    tag = "</think>"
    at = end.index(tag)
    for k in range(len(tag) - 1, 1, -1):  # the longest prefix first
        if text.endswith(tag[:k]):
            return end[at + k :]
    return end


def stop_across(head, out, stop, tokenizer, context):
    """Turn 1's `out`, cut at a stop string that begins in the text before it (`head`: turn 0 cut
    inside "</answer>", at "... </"), which the engine never sees: it searches its own output
    only. Cut as one call would: at the first token whose text completes the string, the text
    ending with it (that token may run past it), finish "stop". Else `out` as it is. `context`:
    the ids before turn 1's, decoded with them as the engine's detokenizer does."""
    import rollout

    hit = rollout.first_stop(head + out["text"], len(head), stop)
    if hit is None or hit[0] - len(hit[1]) >= len(head):
        return out  # no stop string, or one all in turn 1: the engine's own
    end, reason = hit
    shown = len(tokenizer.decode(context, skip_special_tokens=True))
    for k in range(1, len(out["token_ids"]) + 1):
        whole = tokenizer.decode(context + out["token_ids"][:k], skip_special_tokens=True)
        if len(whole) - shown >= end - len(head) and not whole.endswith("\ufffd"):
            cut = {"text": out["text"][: end - len(head)], "finish_reason": "stop"}
            cut["stop_reason"] = reason
            cut["token_ids"] = out["token_ids"][:k]
            cut["logprobs"] = out["logprobs"][:k]
            return {**out, **cut}
    return out  # the ids decode shorter than the engine's text (not seen): left as sampled
