"""The course's test hooks (stanford-cs336/assignment5-alignment, tests/adapters.py), each one a
call of this project's function: course/run.py puts this file in place of the course's stub.

The names and signatures are the handouts' (seed 000 §4.2/§7.2, seed 004 §2); what each one calls
is in losses.py. The optional safety/RLHF supplement's hooks (packed SFT data, batching, MMLU and
GSM8K parsing, DPO) have no counterpart here: they raise NotImplementedError saying so.

Not meant to be imported by the project: nothing below the course/ folder uses it.
"""

import losses

# the handouts' hook names, in the course file's order (tests/test_course.py checks them)
ADAPTERS = (
    "run_tokenize_prompt_and_output",
    "run_compute_group_normalized_rewards",
    "run_compute_entropy",
    "run_get_response_log_probs",
    "run_compute_naive_policy_gradient_loss",
    "run_compute_grpo_clip_loss",
    "run_compute_policy_gradient_loss",
    "run_masked_mean",
    "run_sft_microbatch_train_step",
    "run_grpo_microbatch_train_step",
    "run_masked_normalize",
    "get_packed_sft_dataset",
    "run_iterate_batches",
    "run_parse_mmlu_response",
    "run_parse_gsm8k_response",
    "run_compute_per_instance_dpo_loss",
)
# the supplement's hooks: the project has no such function, so each one says so
OUT_OF_SCOPE = (
    "get_packed_sft_dataset",
    "run_iterate_batches",
    "run_parse_mmlu_response",
    "run_parse_gsm8k_response",
    "run_compute_per_instance_dpo_loss",
)
SUPPLEMENT = "is the optional safety/RLHF supplement's; this project does not implement it"


# ----------------------------------------------------------------------------- SFT (seed 000 §4)
def run_tokenize_prompt_and_output(prompt_strs, output_strs, tokenizer):
    return losses.tokenize_prompt_and_output(prompt_strs, output_strs, tokenizer)


def run_compute_entropy(logits):
    return losses.compute_entropy(logits)


def run_get_response_log_probs(model, input_ids, labels, return_token_entropy):
    return losses.get_response_log_probs(
        model, input_ids, labels, return_token_entropy=return_token_entropy
    )


def run_masked_normalize(tensor, mask, dim=None, normalize_constant=1.0):
    return losses.masked_normalize(tensor, mask, normalize_constant, dim)


def run_sft_microbatch_train_step(
    policy_log_probs, response_mask, gradient_accumulation_steps, normalize_constant=1.0
):
    return losses.sft_microbatch_train_step(
        policy_log_probs, response_mask, gradient_accumulation_steps, normalize_constant
    )


# ----------------------------------------------------------------------------- GRPO (seed 000 §7)
def run_compute_group_normalized_rewards(
    reward_fn,
    rollout_responses,
    repeated_ground_truths,
    group_size,
    advantage_eps,
    normalize_by_std,
):
    return losses.compute_group_normalized_rewards(
        reward_fn,
        rollout_responses,
        repeated_ground_truths,
        group_size,
        advantage_eps,
        normalize_by_std,
    )


def run_compute_naive_policy_gradient_loss(raw_rewards_or_advantages, policy_log_probs):
    return losses.compute_naive_policy_gradient_loss(raw_rewards_or_advantages, policy_log_probs)


def run_compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, cliprange):
    return losses.compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, cliprange)


def run_compute_policy_gradient_loss(
    policy_log_probs, loss_type, raw_rewards, advantages, old_log_probs, cliprange
):
    return losses.compute_policy_gradient_loss(
        policy_log_probs,
        loss_type,
        raw_rewards=raw_rewards,
        advantages=advantages,
        old_log_probs=old_log_probs,
        cliprange=cliprange,
    )


def run_masked_mean(tensor, mask, dim=None):
    return losses.masked_mean(tensor, mask, dim)


def run_grpo_microbatch_train_step(
    policy_log_probs,
    response_mask,
    gradient_accumulation_steps,
    loss_type,
    raw_rewards=None,
    advantages=None,
    old_log_probs=None,
    cliprange=None,
):
    return losses.grpo_microbatch_train_step(
        policy_log_probs,
        response_mask,
        gradient_accumulation_steps,
        loss_type,
        raw_rewards=raw_rewards,
        advantages=advantages,
        old_log_probs=old_log_probs,
        cliprange=cliprange,
    )


# ----------------------------------------------------------------------------- the supplement
def get_packed_sft_dataset(tokenizer, dataset_path, seq_length, shuffle):
    raise NotImplementedError(f"get_packed_sft_dataset {SUPPLEMENT} (sft.py packs no dataset)")


def run_iterate_batches(dataset, batch_size, shuffle):
    raise NotImplementedError(f"run_iterate_batches {SUPPLEMENT}")


def run_parse_mmlu_response(mmlu_example, model_output):
    raise NotImplementedError(f"run_parse_mmlu_response {SUPPLEMENT} (no MMLU task here)")


def run_parse_gsm8k_response(model_output):
    raise NotImplementedError(
        f"run_parse_gsm8k_response {SUPPLEMENT} (grader.gsm8k_reward_fn grades, it does not parse)"
    )


def run_compute_per_instance_dpo_loss(
    lm, lm_ref, tokenizer, beta, prompt, response_chosen, response_rejected
):
    raise NotImplementedError(f"run_compute_per_instance_dpo_loss {SUPPLEMENT} (no DPO here)")
