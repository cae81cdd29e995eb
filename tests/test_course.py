"""course/: the course's test hooks (course/adapters.py) and the one command that runs the course's
tests against them (course/run.py).

The course's own suite is not run here (its repository is not in CI); these tests pin what it
relies on: the hook names and keyword parameters of the course's tests/adapters.py, a few values
by hand, and the runner's scratch copy on a stand-in course folder.
"""

import importlib.util
import inspect
import math
import os

import pytest
import torch

from conftest import ROOT


def load(name):
    """course/<name>.py as a module (course/ is not on sys.path: its names are generic)."""
    spec = importlib.util.spec_from_file_location(f"course_{name}", f"{ROOT}/course/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


adapters = load("adapters")
course_run = load("run")

# The course's tests/adapters.py: each hook and its parameters, which its tests pass by keyword.
# Seed 000 names the first eleven (its "implement [adapters.run_...]" lines), seed 004 four of them;
# the last five are the optional safety/RLHF supplement's.
COURSE_HOOKS = {
    "run_tokenize_prompt_and_output": "prompt_strs, output_strs, tokenizer",
    "run_compute_group_normalized_rewards": "reward_fn, rollout_responses, repeated_ground_truths, "
    "group_size, advantage_eps, normalize_by_std",
    "run_compute_entropy": "logits",
    "run_get_response_log_probs": "model, input_ids, labels, return_token_entropy",
    "run_compute_naive_policy_gradient_loss": "raw_rewards_or_advantages, policy_log_probs",
    "run_compute_grpo_clip_loss": "advantages, policy_log_probs, old_log_probs, cliprange",
    "run_compute_policy_gradient_loss": "policy_log_probs, loss_type, raw_rewards, advantages, "
    "old_log_probs, cliprange",
    "run_masked_mean": "tensor, mask, dim",
    "run_sft_microbatch_train_step": "policy_log_probs, response_mask, "
    "gradient_accumulation_steps, normalize_constant",
    "run_grpo_microbatch_train_step": "policy_log_probs, response_mask, "
    "gradient_accumulation_steps, loss_type, raw_rewards, advantages, old_log_probs, cliprange",
    "run_masked_normalize": "tensor, mask, dim, normalize_constant",
    "get_packed_sft_dataset": "tokenizer, dataset_path, seq_length, shuffle",
    "run_iterate_batches": "dataset, batch_size, shuffle",
    "run_parse_mmlu_response": "mmlu_example, model_output",
    "run_parse_gsm8k_response": "model_output",
    "run_compute_per_instance_dpo_loss": "lm, lm_ref, tokenizer, beta, prompt, response_chosen, "
    "response_rejected",
}
SUPPLEMENT_HOOKS = list(COURSE_HOOKS)[11:]


def test_every_course_hook_is_ours_with_the_courses_parameters():
    assert list(adapters.ADAPTERS) == list(COURSE_HOOKS)
    assert list(adapters.OUT_OF_SCOPE) == SUPPLEMENT_HOOKS
    public = []
    for name, value in vars(adapters).items():
        if inspect.isfunction(value) and not name.startswith("_"):
            public.append(name)
    assert sorted(public) == sorted(COURSE_HOOKS), "course/adapters.py holds the hooks alone"
    for name, params in COURSE_HOOKS.items():
        found = ", ".join(inspect.signature(getattr(adapters, name)).parameters)
        assert found == params, name


@pytest.mark.parametrize("name", SUPPLEMENT_HOOKS)
def test_a_supplement_hook_says_it_is_out_of_scope(name):
    hook = getattr(adapters, name)
    nothing = [None] * len(inspect.signature(hook).parameters)
    with pytest.raises(NotImplementedError, match=f"{name} is the optional safety/RLHF"):
        hook(*nothing)


def test_hooks_by_hand():
    x = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    keep = torch.tensor([[True, False], [True, True]])
    assert adapters.run_masked_mean(tensor=x, mask=keep).item() == 3.0  # (1 + 3 + 5) / 3
    assert adapters.run_masked_mean(x, keep, dim=0).tolist() == [2.0, 5.0]
    by_row = adapters.run_masked_normalize(tensor=x, mask=keep, dim=1, normalize_constant=2.0)
    assert by_row.tolist() == [0.5, 4.0]
    # groups of 2: rewards (1, 0) -> mean 0.5, unbiased std sqrt(0.5); (1, 1) -> 0 either way
    rewards = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 1.0}

    def reward_fn(response, truth):
        return {"reward": rewards[response], "format_reward": 1.0, "answer_reward": 1.0}

    adv, raw, _ = adapters.run_compute_group_normalized_rewards(
        reward_fn=reward_fn,
        rollout_responses=list("abcd"),
        repeated_ground_truths=["42"] * 4,
        group_size=2,
        advantage_eps=1e-6,
        normalize_by_std=True,
    )
    assert raw.tolist() == [1.0, 0.0, 1.0, 1.0]
    half = 0.5 / (math.sqrt(0.5) + 1e-6)  # the course adds eps to the std
    assert adv.tolist() == pytest.approx([half, -half, 0.0, 0.0])
    # ratio 1.5 with A = 1 clips at 1 + 0.2; with A = -1 the unclipped 1.5 * -1 is the min
    new = torch.log(torch.tensor([[1.5], [1.5]]))
    old = torch.zeros(2, 1)
    loss, meta = adapters.run_compute_grpo_clip_loss(
        advantages=torch.tensor([[1.0], [-1.0]]),
        policy_log_probs=new,
        old_log_probs=old,
        cliprange=0.2,
    )
    assert loss.flatten().tolist() == pytest.approx([-1.2, 1.5])
    assert meta["clipped"].flatten().tolist() == [True, False]


STUB = "def run_masked_mean(tensor, mask, dim=None):\n    raise NotImplementedError\n"
COURSE_CONFTEST = "import pytest\n\n\n@pytest.fixture\ndef model_id():\n    return '/data/x'\n"


def stand_in_course(folder):
    """A course checkout in the course's layout (tests/ a package, a stub adapters.py, a conftest
    with the course's model_id fixture) whose tests check the runner's promises, without torch."""
    tests = os.path.join(folder, "tests")
    os.makedirs(tests)
    files = {
        "__init__.py": "",
        "adapters.py": STUB,
        "conftest.py": COURSE_CONFTEST,
        "test_grpo.py": "\n".join(
            [
                "import importlib.util",
                "import os",
                "",
                "",
                "def test_our_adapters_stand_in_for_the_stubs():",
                "    with open(os.path.join(os.path.dirname(__file__), 'adapters.py')) as f:",
                "        assert 'OUT_OF_SCOPE' in f.read()",
                "    assert importlib.util.find_spec('losses') is not None",
                "    assert os.path.isdir('tests')  # run from the folder above tests/",
                "",
                "",
                "def test_model_id(model_id):",
                "    assert model_id == os.environ['EXPECTED_MODEL']",
                "",
            ]
        ),
    }
    for name, text in files.items():
        with open(os.path.join(tests, name), "w") as f:
            f.write(text)
    return tests


def test_the_runner_runs_a_copy_with_our_adapters(tmp_path, monkeypatch, capfd):
    course = str(tmp_path / "course")
    tests = stand_in_course(course)
    model = str(tmp_path / "qwen")
    monkeypatch.setenv("EXPECTED_MODEL", model)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the installed plugins: ~4 s
    # a handout's command names the course's tests/test_grpo.py, not ours
    assert course_run.main(["--model", model, course, "-q", "tests/test_grpo.py"]) == 0
    assert "2 passed" in capfd.readouterr().out
    with open(os.path.join(tests, "adapters.py")) as f:
        assert f.read() == STUB, "the course's own folder is left as it was"
    with pytest.raises(SystemExit, match="no tests/adapters.py under"):
        course_run.main([str(tmp_path)])
