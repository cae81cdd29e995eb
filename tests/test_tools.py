"""tools.py: the tools, the multi-turn loop's masks, budgets and seeds (a scripted policy), and
exact log-probs over multi-turn rows on the real engines (vLLM and hf) with the embedded model."""

import types

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import data
import grpo
import losses
import rollout
import tools
from conftest import one_line_error, requires_vllm, run_script

LOGPROB_ATOL = 1e-4  # test_rollout's single-turn tolerance: fp32 engine vs fp32 forward
EOS = "<EOS>"  # in a script: the tokenizer's EOS token id here


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(data.EMBEDDED_MODEL)


def calculator(max_calls=8, trigger="=", max_obs_tokens=16):
    return tools.Tool("calculator", trigger, " {}", max_calls, max_obs_tokens)


# ----------------------------------------------------------------------------- the tools
@pytest.mark.parametrize(
    "expression, output, status",
    [
        ("5 + 2", "7", "ok"),
        ("(8 - 2) * 5", "30", "ok"),
        ("10 / 4", "2.5", "ok"),
        ("1 / 3", "0.333333", "ok"),
        ("-3 + 1", "-2", "ok"),
        ("0.1 * 3 - 0.3", "0", "ok"),  # the decimals as written: floats would leave 5.55e-17
        ("246913 / 2", "123456.5", "ok"),
        ("1 / 10000000", "1e-07", "ok"),
        ("1 + " * 60 + "1", "ValueError: expression over 200 characters", "error"),
        ("4 / (2 - 2)", "ZeroDivisionError: division by zero", "error"),
        ("5 +", "SyntaxError: invalid syntax", "error"),
        ("", "SyntaxError: no expression before the call", "error"),
        ("10 ** 3", "ValueError: only numbers, + - * / and brackets", "error"),
        ("99999999 * 99999999", "ValueError: number too large", "error"),
    ],
)
def test_calculator(expression, output, status):
    assert tools.calculate(expression) == (output, status)


def test_the_expression_is_the_arithmetic_before_the_trigger():
    assert tools.expression_before(" 5 + 2 =", "=") == "5 + 2"
    assert tools.expression_before("vs 50 no. 5 * 2 =", "=") == "5 * 2"
    assert tools.expression_before("13, 13 * (2 - 1) =", "=") == "13 * (2 - 1)"
    assert tools.expression_before("no numbers =", "=") == ""


def test_last_code_block():
    text = "```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\n```output"
    assert tools.last_code_block(text) == "print(2)\n"
    assert tools.last_code_block("no code ```output") is None


def test_an_observation_is_middle_truncated_to_its_token_cap(tok):
    tool = calculator(max_obs_tokens=12)
    output = "0123456789" * 1_000_000  # 10 MB
    ids, text = tools.observation(tool, output, tok)
    assert len(ids) <= 12
    assert text.startswith(" 0123") and text.endswith("789")
    assert tools.TRUNCATION_MARK in text
    short, text = tools.observation(tool, "42", tok)
    assert text == " 42"
    assert short == tok(" 42", add_special_tokens=False).input_ids


# ----------------------------------------------------------------------------- a scripted policy
class ScriptedEngine(rollout.HFEngine):
    """An engine that says prompt i's script, one turn per call, with the engine's stop
    semantics (stop strings after min_tokens, EOS, max_tokens; the last token may run past a stop
    string); every call's arguments are recorded. n = 1 per prompt."""

    def __init__(self, tokenizer, scripts):
        self.tokenizer = tokenizer
        self.model = types.SimpleNamespace(generation_config=types.SimpleNamespace())
        self.scripts = scripts  # prompt text -> its turns' texts
        self.turn = {}  # prompt text -> turns said
        self.calls = []

    def _script_of(self, prompt):
        for text in self.scripts:
            ids = self.tokenizer(text).input_ids
            if prompt == text or list(prompt[: len(ids)]) == ids:
                return text
        raise AssertionError("no script for this prompt")

    def generate(self, prompts, n, temperature, top_p, max_tokens, min_tokens, stop, seed, seeds):
        assert n == 1
        self.calls.append(
            {"n": len(prompts), "min_tokens": min_tokens, "stop": stop, "seeds": seeds}
        )
        results = []
        for i, prompt in enumerate(prompts):
            key = self._script_of(prompt)
            k = self.turn.get(key, 0)
            self.turn[key] = k + 1
            parts = self.scripts[key][k].split(EOS)
            ids = []
            for part in parts:
                if ids or part is not parts[0]:
                    ids.append(self.tokenizer.eos_token_id)  # an EOS between two parts
                ids += self.tokenizer(part, add_special_tokens=False).input_ids
            if isinstance(prompt, str):
                prompt_ids = self.tokenizer(prompt).input_ids
            else:
                prompt_ids = list(prompt)
            out = {"finish_reason": "length", "stop_reason": None}
            toks = []
            text = ""
            for t in ids[: max_tokens[i]]:
                toks.append(t)
                before = len(text)
                text = self.tokenizer.decode(toks, skip_special_tokens=True)
                hits = []
                for s in stop:
                    at = text.find(s, max(0, before - len(s) + 1))  # vLLM's window
                    if len(toks) > min_tokens and at >= 0:
                        hits.append((at + len(s), s))
                if hits:
                    end, reason = min(hits)
                    text = text[:end]
                    out = {"finish_reason": "stop", "stop_reason": reason}
                    break
                if t == self.tokenizer.eos_token_id:
                    out = {"finish_reason": "stop", "stop_reason": None}
                    break
            logprobs = [-0.1 - 0.01 * j for j in range(len(toks))]
            out |= {"text": text, "token_ids": toks, "logprobs": logprobs}
            out["prompt_token_ids"] = prompt_ids
            results.append([out])
        return results


ANSWER = " </think> <answer> 5 + 2 </answer>"


def scripted(tok, scripts, tool, max_tokens=64, min_tokens=0, seed=1000, stride=100):
    engine = ScriptedEngine(tok, scripts)
    prompts = list(scripts)
    outs = tools.generate(
        engine,
        prompts,
        tool,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop=["</answer>"],
        seed=seed,
        turn_stride=stride,
    )
    return engine, [o[0] for o in outs]


def obs_ids(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def test_zero_one_and_k_calls_and_the_last_turns_trigger_is_trained_not_run(tok):
    scripts = {
        "A: no call": [" 7 vs 7 yes" + ANSWER],
        "B: one call": [" 5 + 2 =", " vs 7 yes" + ANSWER],
        "C: two calls, a third trigger": [" 1 + 1 =", " 2 * 3 =", " 6 + 1 = 7" + ANSWER],
    }
    engine, (a, b, c) = scripted(tok, scripts, calculator(max_calls=2))
    assert (a["calls"], a["turns"], a["obs_tokens"]) == (0, 1, 0)
    assert a["policy_mask"] == [1] * len(a["token_ids"])
    assert (b["calls"], b["turns"]) == (1, 2)
    assert b["text"] == " 5 + 2 = 7 vs 7 yes" + ANSWER
    assert b["policy_text"] == " 5 + 2 = vs 7 yes" + ANSWER  # what is graded: the policy's own
    # the transcript turn by turn (generations.jsonl's "segments"): the tool's output apart
    assert b["segments"] == [
        {"policy": " 5 + 2 ="},
        {"tool": " 7", "status": "ok"},
        {"policy": " vs 7 yes" + ANSWER},
    ]
    assert a["segments"] == [{"policy": a["text"]}]
    first = obs_ids(tok, " 5 + 2 =")
    seven = obs_ids(tok, " 7")
    assert b["token_ids"][: len(first) + len(seven)] == first + seven
    assert b["policy_mask"][len(first) : len(first) + len(seven)] == [0] * len(seven)
    assert sum(b["policy_mask"]) == len(b["token_ids"]) - len(seven)
    # C: the third turn's "=" is no stop (2 calls made): sampled and trained, not run
    assert (c["calls"], c["turns"], c["errors"]) == (2, 3, 0)
    assert c["text"] == " 1 + 1 = 2 2 * 3 = 6 6 + 1 = 7" + ANSWER
    assert engine.calls[-1]["stop"] == ["</answer>"]
    assert engine.calls[0]["stop"] == ["</answer>", "="]
    for s in (a, b, c):
        assert len(s["logprobs"]) == len(s["token_ids"]) == len(s["policy_mask"])
        assert "".join(next(iter(seg.values())) for seg in s["segments"]) == s["text"]
        for lp, m in zip(s["logprobs"], s["policy_mask"]):
            assert (lp != 0) == bool(m)  # the engine's log-probs on its own tokens only
        assert s["finish_reason"] == "stop"


def test_seeds_follow_prompt_sample_and_turn_not_the_samples_still_running(tok):
    scripts = {
        "A: done at once": [ANSWER],
        "B: calls twice": [" 1 + 1 =", " 1 + 2 =", ANSWER],
        "C: calls once": [" 2 + 2 =", ANSWER],
    }
    engine, _ = scripted(tok, scripts, calculator(), seed=1000, stride=100)
    # turn t of prompt i (n = 1): 1000 + t x 100 + i; turn 0 is rollout.generate's seed + i
    assert engine.calls[0]["seeds"] is None
    assert engine.calls[1]["seeds"] == [1101, 1102]
    assert engine.calls[2]["seeds"] == [1201]
    # the min_tokens ban is the first turn's only
    engine, _ = scripted(tok, scripts, calculator(), min_tokens=2)
    assert [c["min_tokens"] for c in engine.calls] == [2, 0, 0]


def test_budgets_an_observation_that_does_not_fit_a_turn_cut_by_length_and_eos(tok):
    scripts = {
        "A: no room for the output": [" 12345 + 1 =", ANSWER],
        "B: cut by its length": [" 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9 =", ANSWER],
        "C: EOS mid-turn": [" 3 + 3" + EOS + " =", ANSWER],
    }
    first = len(obs_ids(tok, " 12345 + 1 ="))
    output = len(obs_ids(tok, " 12346"))
    assert output > 1
    # A's output would end exactly at the limit: no room for a sampled token, so the call that
    # ran ends the sample
    limit = first + output
    engine, (a, b, c) = scripted(tok, scripts, calculator(), max_tokens=limit)
    assert a["finish_reason"] == "truncated_by_tool"
    assert (a["calls"], a["obs_tokens"], len(a["token_ids"])) == (1, 0, first)
    assert b["finish_reason"] == "length" and b["calls"] == 0  # its partial expression never ran
    assert len(b["token_ids"]) == limit
    assert c["finish_reason"] == "stop" and c["calls"] == 0
    assert c["token_ids"][-1] == tok.eos_token_id
    # room for no output and one more token (0 or 1 token left): the tool does not even run
    for budget in (first, first + 1):
        engine, (a, _, _) = scripted(tok, scripts, calculator(), max_tokens=budget)
        assert (a["finish_reason"], a["calls"], len(a["token_ids"])) == (
            "truncated_by_tool",
            0,
            first,
        )
    # one more token of room: A's output fits, then its next turn has one token
    engine, (a, _, _) = scripted(tok, scripts, calculator(), max_tokens=limit + 1)
    assert a["calls"] == 1 and a["obs_tokens"] == output
    assert a["finish_reason"] == "length" and len(a["token_ids"]) == limit + 1


def demo_args(**kw):
    args = dict(
        group_size=1,
        temperature=1.0,
        top_p=1.0,
        max_tokens=64,
        min_tokens=2,
        rollout_batch_size=3,
        mask_truncated=False,
        mask_void_turns=False,
        micro_train_batch_size=4,
        thinking_budget=None,
    )
    return types.SimpleNamespace(**(args | kw))


def test_collate_the_loss_reads_policy_tokens_only(tok):
    """grpo.rollout + collate on scripted multi-turn rows: the loss-carrying positions are exactly
    the policy's, the engine's log-probs are there only, and the min-tokens ban is in the first
    turn."""
    scripts = {
        "A: one call": [" 5 + 2 =", " vs 7 yes" + ANSWER],
        "B: two calls": [" 1 + 1 =", " 2 * 3 =", ANSWER],
        "C: none": [ANSWER],
    }
    engine = ScriptedEngine(tok, scripts)
    args = demo_args(mask_truncated=True)
    rows = [{"prompt": p, "ground_truth": None, "stop": ["</answer>"]} for p in scripts]
    batch = grpo.rollout(engine, rows, args, 0, calculator())
    tensors = grpo.collate(batch, args)
    policy = torch.zeros_like(tensors["loss_mask"])
    ban = torch.zeros_like(tensors["loss_mask"])
    for i in range(3):
        s = len(batch["prompt_ids"][i]) - 1
        mask = batch["policy_masks"][i]
        policy[i, s : s + len(mask)] = torch.tensor(mask, dtype=torch.bool)
        ban[i, s : s + 2] = True  # --min-tokens 2: inside every first turn here
        assert sum(mask) < len(mask) or i == 2
    assert torch.equal(tensors["loss_mask"], policy)
    assert torch.equal(tensors["policy_mask"], policy)
    assert torch.equal(tensors["engine_log_probs"] != 0, policy)
    assert torch.equal(tensors["ban_mask"], ban)
    assert tensors["response_mask"].sum() > policy.sum()  # tool output: response, not loss
    metrics = grpo.tool_metrics(batch)
    assert metrics["tool/calls_mean"] == 1.0 and metrics["tool/calls_max"] == 2
    assert metrics["tool/frac_with_call"] == pytest.approx(2 / 3)


def test_void_turns_leave_the_loss_but_stay_in_the_baseline(tok):
    """--mask-void-turns (SimpleTIR): a call with nothing to run (no expression before "=") and a
    response that ends with no answer and no code carry no loss (an answer before a last check
    is an answer; a cut at --max-tokens is --mask-truncated's, not void); they are counted in
    tool/void_turn_rate; their rewards still enter the group's baseline (advantages reads every
    row's reward, not the loss mask)."""
    scripts = {
        "A: a call with no expression": [" so =", ANSWER],
        "B: neither an answer nor code": [" 1 + 1 is 2" + EOS],
        "C: a call, then the answer": [" 5 + 2 =", ANSWER],
        "D: the answer, then a check": [" so \\boxed{7}. check 5 + 2 =", " yes" + EOS],
        "E: cut at its length": [" one two three four five six seven eight nine ten"],
    }
    engine = ScriptedEngine(tok, scripts)
    args = demo_args(group_size=5, mask_void_turns=True)
    rows = [{"prompt": p, "ground_truth": None, "stop": ["</answer>"]} for p in scripts]
    batch = grpo.rollout(engine, rows, demo_args(max_tokens=34), 0, calculator())  # E: 35
    assert batch["void"] == [True, True, False, False, False]  # D answered; E is truncation's
    assert batch["truncated"] == [False, False, False, False, True]
    assert batch["errors"] == [0, 0, 0, 0, 0]  # a void call is no error: nothing ran
    assert grpo.tool_metrics(batch)["tool/void_turn_rate"] == pytest.approx(2 / 5)
    tensors = grpo.collate(batch, args)
    assert not tensors["loss_mask"][:2].any()
    for i in (2, 3, 4):
        assert torch.equal(tensors["loss_mask"][i], tensors["policy_mask"][i])
    assert tensors["policy_mask"][:2].any()  # still scored for a KL, just not trained on


def _without(x, keep):
    """Rows of x (B, T) with only the `keep` positions, left-aligned, zero-padded."""
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        kept = x[i][keep[i]]
        out[i, : len(kept)] = kept
    return out


@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
@pytest.mark.parametrize("length_norm", losses.LENGTH_NORMS)
def test_tool_tokens_act_as_if_absent_at_the_gradient(loss, length_norm):
    """Every loss and normaliser, with a KL term, an entropy bonus and importance weights, under
    bf16 autocast: the loss and the gradient of rows with tool tokens (mask 0) equal those of the
    same rows with the tool tokens deleted; the tool tokens get no gradient."""
    g = torch.Generator().manual_seed(0)
    B, T = 3, 12
    policy = torch.rand(B, T, generator=g) > 0.3  # (B, T) policy tokens; the rest tool output
    policy[:, 0] = True
    logp = -torch.rand(B, T, generator=g) - 0.1
    old = logp + 0.05 * torch.randn(B, T, generator=g)
    ref = logp + 0.05 * torch.randn(B, T, generator=g)
    ent = torch.rand(B, T, generator=g)
    isw = 1 + 0.1 * torch.rand(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    raw = torch.rand(B, generator=g)
    settings = losses.LossSettings(
        loss=loss,
        cliprange=0.2,
        length_norm=length_norm,
        normalize_constant=float(T),
        kl_beta=0.1,
        entropy_coef=0.01,
    )
    packed = policy.sum(1)  # (B,) the policy tokens of each row
    dense = torch.arange(T)[None, :] < packed[:, None]  # (B, T) the same, left-aligned

    def run(mask, x_logp, x_old, x_ref, x_ent, x_isw):
        leaf = x_logp.clone().requires_grad_()
        ent_leaf = x_ent.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = losses.grpo_microbatch_loss(
                leaf,
                mask,
                adv,
                raw,
                settings,
                old_log_probs=x_old,
                ref_log_probs=x_ref,
                is_weights=x_isw,
                step_tokens=int(policy.sum()),
                token_entropy=ent_leaf,
            )
        out.backward()
        return out.detach(), leaf.grad, ent_leaf.grad

    with_tool = run(policy, logp, old, ref, ent, isw)
    moved = [_without(x, policy) for x in (logp, old, ref, ent, isw)]
    moved[4] = torch.where(dense, moved[4], torch.ones(()))
    absent = run(dense, *moved)
    torch.testing.assert_close(with_tool[0], absent[0])
    for grad_with, grad_absent in zip(with_tool[1:], absent[1:]):
        assert torch.all(grad_with[~policy] == 0)
        torch.testing.assert_close(_without(grad_with, policy), grad_absent)


# ----------------------------------------------------------------------------- the real engines
@pytest.fixture(scope="module")
def embedded_vllm():
    return rollout.init_vllm(
        data.EMBEDDED_MODEL, device="cpu", seed=0, max_model_len=512, enforce_eager=True
    )


@pytest.fixture(scope="module")
def embedded_hf():
    return AutoModelForCausalLM.from_pretrained(data.EMBEDDED_MODEL, dtype=torch.float32).eval()


def multi_turn_rows(n_prompts):
    return data.load_task(
        "countdown", "test", "synthetic", n_prompts, 0, prompt="r1_zero_calculator"
    )


def multi_turn_batch(engine, tool, temperature, n_prompts=4, group=2, seed=7):
    rows = multi_turn_rows(n_prompts)
    args = demo_args(
        group_size=group,
        temperature=temperature,
        max_tokens=96,
        min_tokens=4,
        rollout_batch_size=n_prompts * group,
    )
    batch = grpo.rollout(engine, rows, args, seed, tool)
    batch["ban_token_ids"] = rollout.min_tokens_banned_ids(engine)
    return batch, args


def check_exact(batch, args, model, shared_prefix):
    """The trainer's log-probs over the multi-turn rows against the engine's, at every policy
    position; -> the largest difference."""
    tensors = grpo.collate(batch, args)
    runtime = {"shared_prefix": shared_prefix, "compute_dtype": torch.float32}
    trainer = grpo.batch_log_probs(model, tensors, args, runtime, batch["ban_token_ids"])
    policy = tensors["policy_mask"]
    assert policy.sum() < tensors["response_mask"].sum(), "no tool output in the batch"
    worst = (trainer - tensors["engine_log_probs"])[policy].abs().max().item()
    assert worst < LOGPROB_ATOL
    return worst


@requires_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_multi_turn_log_probs_are_the_engines_vllm(embedded_vllm, embedded_hf, temperature):
    batch, args = multi_turn_batch(embedded_vllm, calculator(), temperature)
    assert max(batch["calls"]) >= 2
    for shared_prefix in (False, True):
        worst = check_exact(batch, args, embedded_hf, shared_prefix)
        print(f"\nvLLM multi-turn, T={temperature}, shared prefix {shared_prefix}: {worst:.1e}")
    # each turn continued exactly the ids before it: the prompt, then every segment as sampled
    again, _ = multi_turn_batch(embedded_vllm, calculator(), temperature)
    assert again["response_ids"] == batch["response_ids"]  # deterministic under fixed seeds


@requires_vllm
def test_a_trigger_that_ends_mid_token(embedded_vllm, embedded_hf, tok):
    """ "vs 5" ends inside the token " 50" (" 56", ...): the engine's last token runs past the
    trigger, and the tool output follows that token, not the trigger's text."""
    tool = calculator(trigger="vs 5")
    batch, args = multi_turn_batch(embedded_vllm, tool, 1.0)
    seen = 0
    rows = zip(batch["response_ids"], batch["policy_masks"], batch["transcripts"])
    for ids, mask, transcript in rows:
        for k in range(1, len(ids)):
            if mask[k - 1] == 1 and mask[k] == 0:  # the token before a tool output
                said = tok.decode(ids[:k])
                assert said.rstrip().split()[-1].startswith("5")
                seen += 1
                if seen == 1:
                    # the transcript holds the whole token, not the text cut at the trigger
                    assert transcript.startswith(said) and not said.endswith("vs 5")
    assert seen
    check_exact(batch, args, embedded_hf, shared_prefix=True)


@requires_vllm
def test_greedy_turns_are_the_same_on_both_engines(embedded_vllm):
    """Greedy, with --min-tokens 4 (the demo's: the first " =" falls inside it, where neither
    engine checks a stop string): the hf engine's multi-turn samples equal vLLM's, ids and
    masks."""
    prompts = [r["prompt"] for r in multi_turn_rows(3)]
    kw = dict(temperature=0.0, max_tokens=96, min_tokens=4, stop=["</answer>"])
    engine = rollout.HFEngine(data.EMBEDDED_MODEL)
    hf = tools.generate(engine, prompts, calculator(), **kw)
    vllm = tools.generate(embedded_vllm, prompts, calculator(), **kw)
    for a, b in zip(hf, vllm):
        assert a[0]["token_ids"] == b[0]["token_ids"]
        assert a[0]["policy_mask"] == b[0]["policy_mask"]
        assert a[0]["calls"] >= 1


def test_multi_turn_log_probs_are_the_engines_hf(embedded_hf):
    engine = rollout.HFEngine(data.EMBEDDED_MODEL)
    batch, args = multi_turn_batch(engine, calculator(), 1.0, n_prompts=2)
    worst = check_exact(batch, args, embedded_hf, shared_prefix=False)
    print(f"\nhf multi-turn, T=1.0: {worst:.1e}")


# --------------------------------------------------------------------------- python in the sandbox
def test_python_calls_a_scripted_policy_makes(tok):
    """The python tool on the run's pool: a print, a syntax error, an infinite loop, a 10 MB
    print and a host file's read become one-line observations (the print's head and tail, capped
    at --max-obs-tokens); a turn cut by its length never runs its partial code."""
    import shutil

    import sandbox

    call = "```python\n{}\n```\n```output"
    rest = " so the answer is <answer> 5 </answer>"
    scripts = {
        "A: prints": [call.format("print(2 + 3)"), rest],
        "B: a syntax error": [call.format("print(2 +"), rest],
        "C: an infinite loop": [call.format("while True:\n    pass"), rest],
        "D: 10 MB": [call.format("print('0123456789' * 1_000_000)"), rest],
        "E: a host file": [call.format("print(open('/etc/passwd').read())"), rest],
        "F: cut by its length": [call.format("print('never ran' * 2) " + "+ 1 " * 60), rest],
    }
    isolated = bool(shutil.which("bwrap"))
    with sandbox.ToolPool(4, timeout=2.0, isolated=isolated, max_chars=8 * 32) as pool:
        tool = tools.Tool("python", "```output", "\n{}\n```\n", 1, 32, pool)
        engine, outs = scripted(tok, scripts, tool, max_tokens=96)
    a = outs[0]  # prints
    b = outs[1]  # a syntax error
    c = outs[2]  # an infinite loop
    d = outs[3]  # 10 MB
    e = outs[4]  # a host file
    f = outs[5]  # cut by its length
    assert a["text"].endswith("```output\n5\n```\n" + rest)
    assert (a["calls"], a["errors"]) == (1, 0)
    assert "\nSyntaxError: " in b["text"] and b["errors"] == 1
    assert "\nTimeoutError\n```" in c["text"] and (c["errors"], c["timeouts"]) == (1, 1)
    assert tools.TRUNCATION_MARK in d["text"] and d["obs_tokens"] <= 32
    assert "root:" not in e["text"] and e["errors"] == 1
    assert e["text"].split("```output")[1].startswith(("\nPermissionErro", "\nFileNotFound"))
    assert f["finish_reason"] == "length" and f["calls"] == 0
    assert "never rannever ran" not in f["text"]  # what the code would have printed


def test_a_new_tool_is_three_lines_of_tools_py_and_a_prompt(tmp_path, tok, monkeypatch):
    """docs/tools.md's promise, tried in a scratch copy: a tool that answers with the turn's text
    reversed is its name in TOOLS, its call limit in MAX_CALLS, its call in Tool.run, and a prompt
    whose header names its trigger; grpo.py's flags, tools.make, rollout and tool metrics take it
    as it is."""
    import importlib.util
    import os
    import shutil

    from conftest import ROOT

    with open(os.path.join(ROOT, "tools.py")) as f:
        source = f.read()
    edits = [
        ('TOOLS = ("python", "calculator")', 'TOOLS = ("python", "calculator", "reverse")'),
        ('MAX_CALLS = {"python": 1,', 'MAX_CALLS = {"reverse": 2, "python": 1,'),
        (
            '        if self.name == "calculator":',
            '        if self.name == "reverse":\n'
            '            return [(text[::-1], "ok") for text in turn_texts]\n'
            '        if self.name == "calculator":',
        ),
    ]
    for anchor, replacement in edits:
        assert source.count(anchor) == 1, anchor
        source = source.replace(anchor, replacement)
    (tmp_path / "tools_scratch.py").write_text(source)
    spec = importlib.util.spec_from_file_location("tools_scratch", tmp_path / "tools_scratch.py")
    scratch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scratch)
    prompts = tmp_path / "prompts"
    shutil.copytree(data.PROMPTS_DIR, prompts)
    (prompts / "r1_zero_reverse.prompt").write_text(
        '# trigger: "!"\n# output: " {}"\n# template: "r1_zero"\n'
    )
    monkeypatch.setattr(data, "PROMPTS_DIR", str(prompts))
    monkeypatch.setattr(grpo, "tools", scratch)

    args = grpo.parse_args(["--tools", "reverse", "--out", str(tmp_path / "run")])
    assert (args.prompt, args.max_tool_calls) == ("r1_zero_reverse", 2)
    tool = scratch.make(args)
    rows = data.load_task("countdown", "test", "synthetic", 1, 0, prompt=args.prompt)
    engine = ScriptedEngine(tok, {rows[0]["prompt"]: [" so abc!", ANSWER]})  # > --min-tokens
    batch = grpo.rollout(
        engine, rows, types.SimpleNamespace(**(vars(args) | {"group_size": 1})), 0, tool
    )
    assert batch["transcripts"] == [" so abc! !cba os " + ANSWER]
    assert batch["responses"] == [" so abc!" + ANSWER]
    assert grpo.tool_metrics(batch)["tool/calls_mean"] == 1


# ----------------------------------------------------------------------------- the thinking budget
THINKING = {
    "A: done inside the budget": [" 7 vs 7 yes" + ANSWER],
    "B: thinks past it": [
        " 1 + 1 = 2, 2 * 3 = 6 vs 7 no. 1 * 1 = 1, 1 + 3 = 4 vs 7 no.",
        ANSWER[9:],
    ],
    "C: closes, answers past it": [
        " 7 vs 7 yes </think> <answer> (5 + 2) * 1 * 1 *",
        " 1 </answer>",
    ],
}
BUDGET = 20  # A's 16 tokens fit; B's thinking and C's answer run past


def thinking_samples(tok, thinking, max_tokens=64):
    engine = ScriptedEngine(tok, THINKING)
    outs = tools.generate_thinking(
        engine,
        list(THINKING),
        thinking,
        max_tokens=max_tokens,
        min_tokens=2,
        stop=["</answer>"],
        seed=1000,
        turn_stride=100,
    )
    return engine, [o[0] for o in outs]


def test_a_thinking_budget_appends_the_close_as_context_with_no_loss(tok):
    """--thinking-budget on a scripted policy: a response that ends inside the budget is turn 0
    as sampled; one still thinking at the budget gets " </think>" (mask 0, log-prob 0) and goes on
    in a second turn seeded as a tool run's turn 1; one that closed its thinking goes on with
    nothing appended; the close counts in --max-tokens. grpo.rollout + collate: the loss and the
    engine's log-probs sit on the policy's tokens only, and the close is graded."""
    end = tools.THINKING_END["prompt"]
    end_ids = obs_ids(tok, end)
    engine, (a, b, c) = thinking_samples(tok, tools.Thinking(BUDGET, end))
    assert engine.calls[0]["min_tokens"] == 2 and engine.calls[1]["min_tokens"] == 0
    assert engine.calls[1]["seeds"] == [1101, 1102]  # seed + stride + i, for B and C
    assert a["segments"] == [{"policy": THINKING["A: done inside the budget"][0]}]
    assert (a["turns"], a["thinking_cut"], a["policy_mask"]) == (1, False, [1] * 16)
    thought = obs_ids(tok, THINKING["B: thinks past it"][0])[:BUDGET]
    assert b["token_ids"] == thought + end_ids + obs_ids(tok, ANSWER[9:])
    assert b["policy_mask"] == [1] * BUDGET + [0] * len(end_ids) + [1] * 9
    assert b["logprobs"][BUDGET : BUDGET + len(end_ids)] == [0.0] * len(end_ids)
    assert b["thinking_cut"] and b["segments"][1] == {"appended": end}
    assert b["text"] == tok.decode(thought) + end + ANSWER[9:] == b["policy_text"]
    assert c["text"] == " 7 vs 7 yes </think> <answer> (5 + 2) * 1 * 1 * 1 </answer>"
    assert (c["turns"], c["thinking_cut"], sum(c["policy_mask"])) == (2, False, BUDGET + 4)
    for s in (a, b, c):
        assert "".join(next(iter(seg.values())) for seg in s["segments"]) == s["text"]
        assert s["finish_reason"] == "stop" and "calls" not in s
    # no room for the close and one more token: B stays cut; a budget >= --max-tokens is none
    _, (_, b, _) = thinking_samples(tok, tools.Thinking(BUDGET, end), BUDGET + len(end_ids))
    assert (b["finish_reason"], b["thinking_cut"], len(b["token_ids"])) == ("length", False, 20)
    engine, _ = thinking_samples(tok, tools.Thinking(64, end), 64)
    assert len(engine.calls) == 1

    args = demo_args(thinking_budget=BUDGET, max_tokens=64)
    rows = [{"prompt": p, "ground_truth": None, "stop": ["</answer>"]} for p in THINKING]
    batch = grpo.rollout(ScriptedEngine(tok, THINKING), rows, args, 0)
    assert batch["thinking_cut"] == [False, True, False]
    assert "</think> <answer>" in batch["responses"][1]  # graded with the close: format 1
    tensors = grpo.collate(batch, args)
    policy = tensors["policy_mask"]
    assert torch.equal(tensors["loss_mask"], policy)
    assert torch.equal(tensors["engine_log_probs"] != 0, policy)
    assert tensors["response_mask"].sum() == policy.sum() + len(end_ids)


SPLIT = {  # cut at 12 tokens: D inside its "</answer>", E inside its "</think>"
    "D: cut inside </answer>": [" 7 vs 7 yes </think> <answer> 5 </answer>", "answer> and on"],
    "E: cut inside </think>": [" 1 + 1 = 2 vs 7 no. 7 yes </think>", " <answer> 5 </answer>"],
}


def test_a_thinking_budget_cut_inside_a_tag_finishes_it(tok):
    """A cut inside "</answer>" (turn 0 ends "... </"): turn 1's engine never sees the stop
    string it completes, so generate_thinking cuts turn 1 where one call would have stopped (the
    same ids, text and finish as the whole script in one call), not at --max-tokens. A cut inside
    "</think>" gets only the tag's rest appended, not a second close."""
    end = tools.THINKING_END["prompt"]
    engine = ScriptedEngine(tok, SPLIT)
    kw = dict(max_tokens=64, stop=["</answer>"], seed=1000, turn_stride=100)
    outs = tools.generate_thinking(engine, list(SPLIT), tools.Thinking(12, end), **kw)
    d, e = [o[0] for o in outs]
    whole = {"D": ["".join(SPLIT["D: cut inside </answer>"])]}  # the same policy, one call
    one = ScriptedEngine(tok, whole).generate(["D"], 1, 1.0, 1.0, [64], 0, ["</answer>"], 0, None)
    one = one[0][0]
    assert one["text"].endswith("</answer>") and one["finish_reason"] == "stop"
    assert d["turns"] == 2 and not d["thinking_cut"]
    assert d["text"] == d["policy_text"] == " 7 vs 7 yes </think> <answer> 5 </answer>"
    assert (d["text"], d["token_ids"]) == (one["text"], one["token_ids"])
    assert (d["finish_reason"], d["stop_reason"]) == ("stop", "</answer>")
    assert len(d["logprobs"]) == len(d["policy_mask"]) == len(d["token_ids"])
    assert d["segments"][1] == {"policy": "answer>"}
    assert e["thinking_cut"] and e["segments"][1] == {"appended": "think>"}
    rest = obs_ids(tok, "think>")
    assert e["token_ids"][12 : 12 + len(rest)] == rest
    assert e["policy_mask"][12 : 12 + len(rest)] == [0] * len(rest)
    assert e["text"] == " 1 + 1 = 2 vs 7 no. 7 yes </think> <answer> 5 </answer>"
    assert tools.close_rest(" no </think", "\n</think>\n\n") == ">\n\n"
    assert tools.close_rest(" x <", " </think>") == " </think>"  # a comparison, not a tag
    assert tools.close_rest(" x", " </think>") == " </think>"


def test_thinking_budget_flags_resolve_and_refuse_in_one_line(tmp_path):
    """grpo.py's, expert_iteration.py's and eval_zero_shot.py's refusals (tools.check_thinking,
    grpo.check_sampling), the r1_zero reward under --chat-template on included (its format needs
    "</think> <answer>", which the chat's close never gives); the close is the prompt's (r1_zero:
    " </think>") without a chat template, the chat's with one."""
    out = ["--out", str(tmp_path / "run")]
    chat = ["--thinking-budget", "8", "--chat-template", "on"]
    refused = [
        (["grpo.py", "--thinking-budget", "2", "--min-tokens", "4"], "<= --thinking-budget 2"),
        (["grpo.py", "--thinking-budget", "8", "--tools", "calculator"], "combine with --tools"),
        (["expert_iteration.py", "--thinking-budget", "8", "--task", "keyword"], "no <think>"),
        (["grpo.py", *chat, "--reward", "r1_zero"], "never grades as formatted"),
        (["eval_zero_shot.py", *chat, "--task", "gsm8k"], "never grades as formatted"),
    ]
    for argv, needle in refused:
        one_line_error(run_script(argv + out), needle)
    args = grpo.parse_args(["--thinking-budget", "16", *out])
    assert tools.thinking(args) == tools.Thinking(16, " </think>")
    args = grpo.parse_args([*chat, "--task", "math", *out])  # question_only: the box is read
    assert tools.thinking(args) == tools.Thinking(8, "\n</think>\n\n")


@requires_vllm
def test_thinking_budget_log_probs_are_the_engines_vllm(embedded_vllm, embedded_hf):
    """--thinking-budget on the real engine (r1_zero, whose search runs past 40 tokens often): the
    trainer's log-probs equal the engine's at every policy position, the appended close
    included in the context; a response that ends inside the budget is rollout.generate's."""
    rows = data.load_task("countdown", "test", "synthetic", 4, 0, prompt="r1_zero")
    kw = dict(temperature=1.0, max_tokens=96, min_tokens=4)
    args = demo_args(group_size=2, rollout_batch_size=8, thinking_budget=40, **kw)
    batch = grpo.rollout(embedded_vllm, rows, args, 7)
    batch["ban_token_ids"] = rollout.min_tokens_banned_ids(embedded_vllm)
    assert any(batch["thinking_cut"]) and not all(batch["thinking_cut"])
    for shared_prefix in (False, True):
        worst = check_exact(batch, args, embedded_hf, shared_prefix)
        print(f"\nvLLM thinking budget, shared prefix {shared_prefix}: {worst:.1e}")
    plain = rollout.generate(
        embedded_vllm, [r["prompt"] for r in rows], n=2, seed=7, stop=["</answer>"], **kw
    )
    plain = [s for samples in plain for s in samples]
    inside = [k for k, ids in enumerate(batch["response_ids"]) if len(ids) < 40]
    assert inside
    for k in inside:
        assert batch["response_ids"][k] == plain[k]["token_ids"]
