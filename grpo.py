"""GRPO with verifiable rewards: the training loop of seed 000 §7 (Algorithm 2), one flat loop.

Each step of `main`:
  rollout + reward  `collect`: G engine samples per question (with --tools, multi-turn: the
                    policy calls a tool mid-response, tools.py) -> grades (`score`)
  metrics           `summarize`: the batch's metrics, once per step (grpo_ray.py calls it on its
                    generators' joined shards)
  (eval)            every --eval-every steps, greedy, on the engine's weights (and with
                    --eval-samples k, k samples per question: avg@k, pass@k, maj@k)
  train             `train_step`: the no-grad passes (pi_old when a ratio needs it, pi_ref for a
                    KL), then `advantages` (rewards -> advantages, where a reward may read the
                    policy), then epochs x train batches x microbatches, gradient clipping,
                    AdamW; log
  save, sync        a checkpoint every --save-every steps (--keep-checkpoints N: the last N
                    saves' weights too, checkpoints/step_NNNN); the new weights into the engine
grpo_ray.py runs the same collect and train_step in Ray actors. Without --model this is the offline
demo: the embedded model on CPU. The flags are read-only after `resolve`; what this process decides
at run time (devices, dtypes, whether the model allows --shared-prefix) is the runtime record
(`setup_runtime`), saved as runtime.json next to args.json.

Departures from the seeds (their settings, and ours, are in PROFILES):
- trains on the engine's own tokens, scored at its temperature and with its min_tokens ban;
- hub sizes are seed 001's 256/256/128 (seed 000's starter sizes fail its own asserts);
- bf16 compute keeps fp32 master weights (--pure-bf16 is the seeds' choice, which rounds most
  lr-1e-5 updates away);
- -A log pi on stale data is refused;
- seed 002's loop calls scheduler.step() without naming a schedule: the lr is constant unless
  --warmup-frac / --min-lr-frac ask for sft.py's warmup and cosine decay (lr_factor);
- the seeds' raw prompt text by default; --chat-template wraps it in the model's chat template.
The extras (DAPO, rollout importance sampling, KL monitoring, the advantage estimators, CISPO, the
entropy controls, seed 003's menu: curriculum sampling, the pass-rate filter, the length and
language rewards, ...) are in docs/objectives.md.

Examples:
  python grpo.py                                                  # offline CPU demo
  python grpo.py --model Qwen/Qwen2.5-Math-1.5B-Instruct --lr 3e-5  # seed 000, 2 GPUs
  python grpo.py --model Qwen/Qwen3-0.6B --task gsm8k --loss grpo_clip \\
      --epochs-per-rollout-batch 2 --train-batch-size 128 --gradient-accumulation-steps 64
  python grpo.py --model Qwen/Qwen3-1.7B --dry-run                # print the effective settings
"""

import contextlib
import hashlib
import importlib.util
import json
import math
import os
import random
import sys
import time
from statistics import fmean

import torch

import common
import data
import grader
import hardware
import lora
import losses
import metric_table
import rollout as engines
import runs
import sharding
import tools
import validation

# The settings table. An unset flag takes its value from the "hub" row, over which the "demo" row
# (the embedded model, offline on CPU) and then its task's row in TASK_PROFILES write their own.
# A comment names the seed a value comes from ("the seeds": 000 and 001 agree); docs/settings.md
# lists every entry. Seed 000 sets its values for GRPO on
# Qwen/Qwen2.5-Math-1.5B-Instruct (its zero-shot and SFT parts use the base model); seed 001's are
# for Qwen/Qwen3-0.6B.
PROFILES = {
    "hub": dict(
        lr=1e-5,  # the seeds
        n_grpo_steps=200,  # seed 000 §7.2, seed 001 §5
        rollout_batch_size=256,  # seed 001 (seed 000's 16 fails its own asserts)
        group_size=8,  # the seeds
        train_batch_size=256,  # seed 001 (seed 000: 64)
        gradient_accumulation_steps=128,  # the seeds
        temperature=0.7,  # seed 000 (seed 001: 1.0)
        min_tokens=4,  # the seeds
        max_tokens=1024,  # the seeds
        advantage_eps=1e-6,  # the seeds
        loss="reinforce_with_baseline",  # the seeds
        eval_every=10,  # seed 001 §5: validate every 5-10 steps
        eval_n=1024,  # seed 001 §5: on >= 1024 examples
        save_every=50,
        train_n=0,  # all the questions
        kl_estimator="k3",
    ),
    # sized so that the embedded model trains in about 4 minutes on a CPU
    "demo": dict(
        lr=1e-4,
        n_grpo_steps=30,
        rollout_batch_size=64,
        group_size=8,  # the seeds
        train_batch_size=64,
        gradient_accumulation_steps=2,
        temperature=1.0,
        min_tokens=4,  # the seeds
        max_tokens=192,
        advantage_eps=1e-6,  # the seeds
        loss="reinforce_with_baseline",  # the seeds
        eval_every=5,
        eval_n=200,
        save_every=0,
        train_n=2000,
        kl_estimator="k3",
    ),
}
TASK_PROFILES = {
    "gsm8k": dict(temperature=1.0),  # seed 001 §5
    "math": dict(temperature=1.0),  # gsm8k's (no seed runs GRPO on MATH)
    "math500": dict(temperature=1.0),  # gsm8k's
    "keyword": dict(  # seed 004 §3.1.2
        lr=5e-4,
        n_grpo_steps=100,
        group_size=4,
        temperature=0.8,
        max_tokens=60,
        advantage_eps=1e-8,
        loss="grpo_clip",
        kl_estimator="seq",  # Eq. 8, for KL monitoring
    ),
}
# the seeds' spellings of a --loss, mapped to its LOSSES key when the flags are parsed
LOSS_ALIASES = {"GRPO-Clip": "grpo_clip", "GRPO-No-Clip": "grpo_no_clip"}  # seed 001 §6
SEED_SPACE = 2**16  # --seed and step each index 16 bits of the sampling seed (see sample_seed)


# ----------------------------------------------------------------------------- config
# How a flag gets its value:
#   1. the command line (with --resume: the run's args.json, for each flag not typed again);
#   2. else, for a flag whose argparse default is None, its PROFILES entry: the "hub" row, which
#      the "demo" row (the embedded model) overrides where it names the flag, and the task's
#      TASK_PROFILES row overrides both. So a new flag's default is one "hub" line. `resolve` fills
#      these in, derives the run's settings, then runs each group's check_* (beside its flags).
def loss_name(name):
    """argparse type of --loss: a LOSSES key, or the seeds' spelling of one (LOSS_ALIASES)."""
    return LOSS_ALIASES.get(name, name)


def parse_args(argv=None):
    """The flags (`parser`) parsed, a resumed run's restored, then `resolve`d into the run's
    settings."""
    p = parser()
    args = p.parse_args(argv)
    if args.resume:
        runs.resume_from(p, argv, args, needs=("optimizer.pt",))
        # the normaliser has two spellings: the one typed now replaces the run's, so the restored
        # other spelling must not contradict it
        given = runs.explicit_dests(p, argv)
        if "adv_std" in given and "std_norm" not in given:
            args.std_norm = None
        if "std_norm" in given and "adv_std" not in given:
            args.adv_std = None
    return resolve(args)


def parser():
    """The flags, grouped as --help shows them; an unset flag comes from PROFILES (see resolve)."""
    p = common.Parser(
        description="GRPO on a verifiable-reward task (seed 000 §7). "
        "Unset flags come from PROFILES."
    )
    g = model_and_data_flags(p)  # --- model and data ---
    curriculum_flags(g)  # --curriculum (grpo.py's own)
    optimisation_flags(p)  # --- optimisation ---
    loss_flags(p)  # --- loss ---
    correction_flags(p)  # --- off-policy correction and DAPO ---
    sampling_flags(p)  # --- sampling ---
    tool_flags(p)  # --- tools ---
    g = eval_flags(p)  # --- eval and logging ---
    g.add_argument(
        "--kl-every",
        type=common.nonneg_int,
        default=0,
        help="log KL to the initial and previous policy every N steps",
    )
    systems_flags(p)  # --- systems ---
    run_flags(p)  # --- run ---
    lora.add_flags(p)  # --- lora: --lora-rank, ... (lora.py) ---
    return p


# The flag groups grpo.py and expert_iteration.py share, each as --help shows it (grpo_ray.py takes
# all of grpo.py's). A script adds its own flags to a group it gets back.
def model_and_data_flags(p):
    """The "model and data" flags of grpo.py and expert_iteration.py; -> the group."""
    g = p.add_argument_group("model and data")  # --- model and data ---
    g.add_argument(
        "--model",
        default=None,
        help="HF hub id or local dir; omitted = the embedded model (demo profile)",
    )
    g.add_argument(
        "--task", default="countdown", choices=sorted(data.TASKS), help="task (data.load_task)"
    )
    g.add_argument(
        "--prompt", default=None, help="prompts/<name>.prompt; default: data.task_defaults"
    )
    g.add_argument(
        "--reward",
        default=None,
        choices=sorted(grader.REWARD_FNS),
        help="reward fn; default: the task's",
    )
    g.add_argument(
        "--chat-template",
        default="off",
        choices=data.CHAT_TEMPLATES,
        help="wrap each prompt in the model's chat template (on; no_thinking: Qwen3's switch off)",
    )
    g.add_argument(
        "--train-path",
        type=common.data_path,
        default=None,
        help="train JSONL, 'synthetic' (Countdown), or the hub set",
    )
    g.add_argument(
        "--val-path",
        type=common.data_path,
        default=None,
        help="validation file; default: the task's test split",
    )
    g.add_argument(
        "--train-n", type=common.nonneg_int, default=None, help="train questions to load (0 = all)"
    )
    g.add_argument(
        "--data-seed",
        type=common.nonneg_int,
        default=0,
        help="seed of the synthetic data set (kept apart from --seed)",
    )
    g.add_argument(
        "--pass-rates",
        type=common.existing_file,
        default=None,
        help="eval_zero_shot.py --pass-rate-samples' pass_rates.jsonl, read by --keep-pass-rate",
    )
    g.add_argument(
        "--keep-pass-rate",
        type=common.fraction,
        nargs=2,
        metavar=("LO", "HI"),
        default=None,
        help="train on the prompts whose --pass-rates rate is in [LO, HI] only (e.g. 0.125 0.875:"
        " not the always and never solved)",
    )
    return g


def check_data(args):
    """The "model and data" flags that need each other (grpo.py's and expert_iteration.py's)."""
    common.check(
        (args.pass_rates is None) == (args.keep_pass_rate is None),
        "--pass-rates FILE and --keep-pass-rate LO HI go together: pass both or neither",
    )
    common.check(
        args.keep_pass_rate is None or args.keep_pass_rate[0] <= args.keep_pass_rate[1],
        f"--keep-pass-rate {args.keep_pass_rate}: LO must be <= HI",
    )


def curriculum_flags(g):
    """--curriculum and its settings, on grpo.py's "model and data" group `g`."""
    g.add_argument(
        "--curriculum",
        action="store_true",
        help="draw each step's prompts with weight max(floor, 1 - s), s the prompt's running"
        " success rate (Kimi k1.5; grpo.Curriculum)",
    )
    g.add_argument(
        "--curriculum-decay",
        type=common.fraction,
        default=0.5,
        help="s <- decay x s + (1 - decay) x the fraction correct of the prompt's group",
    )
    g.add_argument(
        "--curriculum-floor",
        type=common.probability,
        default=0.05,
        help="the least weight of a prompt (a solved one is still drawn now and then)",
    )


def optimisation_flags(p):
    """The "optimisation" flags; -> the group."""
    g = p.add_argument_group("optimisation")  # --- optimisation ---
    g.add_argument("--lr", type=common.positive_float, default=None, help="AdamW learning rate")
    g.add_argument(
        "--warmup-frac",
        type=common.fraction,
        default=0.0,
        help="fraction of the optimizer steps with linear lr warmup (sft.py's flag; 0 = none)",
    )
    g.add_argument(
        "--min-lr-frac",
        type=common.fraction,
        default=1.0,
        help="cosine lr decay to lr x this by the last step (1 = constant; sft.py decays to 0.1)",
    )
    g.add_argument(
        "--n-grpo-steps", type=common.positive_int, default=None, help="rollout batches to train on"
    )
    g.add_argument(
        "--rollout-batch-size",
        type=common.positive_int,
        default=None,
        help="responses per step = prompts x group size",
    )
    g.add_argument(
        "--group-size", type=common.positive_int, default=None, help="G samples per question"
    )
    g.add_argument(
        "--train-batch-size",
        type=common.positive_int,
        default=None,
        help="responses per optimizer step",
    )
    g.add_argument(
        "--gradient-accumulation-steps",
        type=common.positive_int,
        default=None,
        help="microbatches per optimizer step",
    )
    g.add_argument(
        "--epochs-per-rollout-batch",
        type=common.positive_int,
        default=1,
        help="passes over each rollout batch (>1 = off-policy)",
    )
    trainer_flags(g)  # --max-grad-norm, --gradient-checkpointing, --dtype, --pure-bf16
    return g


def check_optimisation(args):
    """The "optimisation" sizes (seed 000 §7.2's sanity asserts), each naming what to change."""
    check = common.check
    check(
        args.train_batch_size % args.gradient_accumulation_steps == 0,
        "--train-batch-size must be divisible by --gradient-accumulation-steps",
    )
    check(
        args.rollout_batch_size % args.group_size == 0,
        "--rollout-batch-size must be divisible by --group-size",
    )
    check(args.train_batch_size >= args.group_size, "--train-batch-size must be >= --group-size")
    check(
        args.rollout_batch_size % args.train_batch_size == 0,
        "--rollout-batch-size must be a multiple of --train-batch-size",
    )


def trainer_flags(g):
    """--max-grad-norm, --gradient-checkpointing, --dtype, --pure-bf16 on group `g` (grpo.py's
    optimisation group, expert_iteration.py's SFT group)."""
    g.add_argument(
        "--max-grad-norm", type=common.positive_float, default=1.0, help="gradient-norm clip"
    )
    g.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute activations (memory for time)",
    )
    g.add_argument(
        "--dtype",
        default="auto",
        choices=hardware.DTYPES,
        help="compute dtype (auto: bf16 on CUDA, fp32 on CPU)",
    )
    g.add_argument(
        "--pure-bf16",
        action="store_true",
        help="bf16 weights + AdamW state (half the memory; drops small updates)",
    )
    g.add_argument(
        "--attn-implementation",
        default="sdpa",
        choices=hardware.ATTN_IMPLEMENTATIONS,
        help="the policy's attention kernels (from_pretrained's attn_implementation; "
        "flash_attention_2: CUDA and the flash-attn package, without --shared-prefix)",
    )


def loss_flags(p):
    """The "loss" flags; -> the group."""
    g = p.add_argument_group("loss")  # --- loss ---
    g.add_argument(
        "--loss",
        type=loss_name,
        default=None,
        choices=losses.LOSS_TYPES,
        help="policy-gradient loss (seed 001's GRPO-Clip, GRPO-No-Clip are accepted)",
    )
    g.add_argument(
        "--cliprange",
        type=common.positive_float,
        default=0.2,
        help="epsilon of GRPO-Clip / GSPO / CISPO",
    )
    g.add_argument(
        "--cliprange-high",
        type=common.positive_float,
        default=None,
        help="upper epsilon (DAPO clip-higher); default --cliprange",
    )
    g.add_argument(
        "--length-norm",
        default="masked_mean",
        choices=losses.LENGTH_NORMS,
        help="per-sequence reduction",
    )
    g.add_argument(
        "--normalize-constant",
        type=common.positive_float,
        default=None,
        help="masked_normalize divisor; default --max-tokens",
    )
    g.add_argument(
        "--advantage",
        default="grpo",
        choices=list(losses.ADVANTAGES),
        help="advantage estimator: group mean (grpo), leave-one-out mean (rloo), pass@k (passk)",
    )
    g.add_argument(
        "--passk-k",
        type=common.positive_int,
        default=None,
        help="k of --advantage passk (1 <= k < --group-size)",
    )
    g.add_argument(
        "--adv-std",
        default=None,
        choices=losses.ADV_STDS,
        help="divide advantages by the group's reward std (default), the batch's std of the"
        " centred advantages (with grpo: REINFORCE++-baseline) or nothing (Dr. GRPO); with"
        " --advantage passk use none (group divides by the reward std, not pass@k's std)",
    )
    g.add_argument(
        "--std-norm",
        action=common.argparse.BooleanOptionalAction,
        default=None,
        help="older spelling: --std-norm is --adv-std group, --no-std-norm --adv-std none",
    )
    g.add_argument(
        "--advantage-eps", type=common.positive_float, default=None, help="added to the std"
    )
    g.add_argument(
        "--entropy-coef",
        type=common.nonneg_float,
        default=0.0,
        help="entropy bonus: the loss minus this x the response tokens' entropy",
    )
    g.add_argument(
        "--entropy-top-quantile",
        type=common.probability,
        default=1.0,
        help="only this fraction of the optimizer step's response tokens, the highest-entropy"
        " ones, carry the policy-gradient loss (Wang et al. 2025: 0.2; 1 = all)",
    )
    g.add_argument(
        "--kl-beta",
        type=common.nonneg_float,
        default=0.0,
        help="KL(pi || initial policy) penalty weight",
    )
    g.add_argument(
        "--kl-in",
        default="loss",
        choices=["loss", "reward"],
        help="where --kl-beta's KL goes: a term of the loss, or each response's reward minus"
        " beta x its summed log-ratio, before advantages (k1, for --kl-every's monitor too)",
    )
    g.add_argument(
        "--kl-estimator",
        default=None,
        choices=losses.KL_ESTIMATORS,
        help="KL estimator (seq = seed 004 Eq. 8)",
    )
    return g


def check_loss(args):
    """The "loss" flags that contradict each other or the sizes, each naming the fix."""
    check = common.check
    check(
        not args.off_policy or losses.LOSSES[args.loss].needs_old,
        f"--loss {args.loss} with {args.optimizer_steps_per_rollout_batch} optimizer steps per"
        " rollout batch trains -A log pi on data from an older policy, uncorrected:"
        f" use a loss with a ratio ({', '.join(losses.RATIO_LOSSES)})",
    )
    check(
        args.adv_std != "group" or args.group_size >= 2,
        "--adv-std group needs --group-size >= 2 (or pass --adv-std none or batch)",
    )
    check(
        args.advantage == "grpo" or args.loss != "no_baseline",
        f"--advantage {args.advantage}: --loss no_baseline trains on the raw rewards, not on"
        " advantages; choose another --loss",
    )
    check(
        args.advantage != "rloo" or args.group_size >= 2,
        "--advantage rloo needs --group-size >= 2 (a leave-one-out mean)",
    )
    check(
        args.passk_k is None or args.advantage == "passk",
        "--passk-k is the k of --advantage passk: add --advantage passk or drop --passk-k",
    )
    check(
        args.advantage != "passk" or args.passk_k is not None,
        "--advantage passk needs --passk-k K (1 <= K < --group-size)",
    )
    check(
        args.advantage != "passk" or args.passk_k < args.group_size,
        f"--passk-k {args.passk_k} must be below --group-size {args.group_size}"
        " (at K = G every advantage is 0)",
    )
    check(
        args.kl_beta == 0 or args.kl_estimator != "seq",
        "--kl-estimator seq is for monitoring; the penalty needs k1, k2 or k3",
    )
    check(
        args.kl_in == "loss" or args.kl_beta > 0,
        "--kl-in reward penalises the reward by --kl-beta x the KL: set --kl-beta > 0",
    )
    check(
        args.kl_in == "loss" or args.kl_estimator == "k1",
        f"--kl-in reward sums log pi - log pi_ref over a response (k1): pass --kl-estimator k1"
        f" (not {args.kl_estimator}; it also sets --kl-every's monitor)",
    )


def adv_std(args):
    """--adv-std, or the value --std-norm / --no-std-norm spell (group / none); default group. A
    contradiction is one line."""
    spelled = None  # the --adv-std that --std-norm / --no-std-norm spell
    if args.std_norm is True:
        spelled = "group"
    elif args.std_norm is False:
        spelled = "none"
    common.check(
        args.adv_std is None or spelled is None or args.adv_std == spelled,
        f"--adv-std {args.adv_std} contradicts --std-norm={args.std_norm} (--adv-std {spelled}):"
        " pass only --adv-std",
    )
    if args.adv_std is None:
        return spelled or "group"
    return args.adv_std


def correction_flags(p):
    """The "off-policy correction and DAPO" flags; -> the group."""
    g = p.add_argument_group("off-policy correction and DAPO")  # --- correction ---
    g.add_argument(
        "--old-log-probs",
        default="trainer",
        choices=["trainer", "engine"],
        help="pi_old source (engine: skip a pass)",
    )
    g.add_argument(
        "--rollout-is",
        default="none",
        choices=losses.ROLLOUT_IS,
        help="correct engine/trainer mismatch",
    )
    g.add_argument(
        "--rollout-is-cap",
        type=common.positive_float,
        default=2.0,
        help="C: TIS weighs min(rho, C); MIS weighs rho where rho <= C, else 0",
    )
    g.add_argument(
        "--rollout-is-floor",
        type=common.nonneg_float,
        default=0.0,
        help="MIS only: also weight 0 where rho < this (0 = no lower bound, as MIS defines it)",
    )
    g.add_argument(
        "--rollout-is-level",
        default="token",
        choices=["token", "sequence"],
        help="ratio per token or sequence",
    )
    g.add_argument(
        "--dynamic-sampling",
        action="store_true",
        help="drop groups with no variance in --dynamic-sampling-on, resample to fill (DAPO)",
    )
    g.add_argument(
        "--dynamic-sampling-max-rounds",
        type=common.nonneg_int,
        default=3,
        help="extra generation rounds at most",
    )
    g.add_argument(
        "--dynamic-sampling-on",
        default="answer_reward",
        choices=["answer_reward", "reward"],
        help="score whose within-group variance keeps a group: accuracy (DAPO) or the total reward",
    )
    g.add_argument(
        "--mask-truncated", action="store_true", help="truncated responses leave the loss (DAPO)"
    )
    g.add_argument(
        "--overlong-buffer",
        type=common.nonneg_int,
        default=0,
        help="DAPO soft length penalty over the last N tokens",
    )
    g.add_argument(
        "--length-reward-weight",
        type=common.nonneg_float,
        default=0.0,
        help="add w x Kimi k1.5's length reward (shorter correct responses in a group gain) to"
        " each reward; it adds to --overlong-buffer's penalty when both are on",
    )
    g.add_argument(
        "--language-reward-weight",
        type=common.nonneg_float,
        default=0.0,
        help="add w x the fraction of the reasoning's words in --target-language to each reward"
        " (DeepSeek-R1's language consistency); adds to the other shaping terms. The reasoning is"
        " the text before </think> or <answer>, the whole response without them (intellect);"
        " one without words (equations only) scores 0",
    )
    g.add_argument(
        "--target-language",
        default="en",
        choices=sorted(grader.LANGUAGES),
        help="--language-reward-weight's language (en: a word of ASCII letters; zh: a Chinese"
        " character; grader.language_fraction)",
    )
    return g


def check_correction(args):
    """The "off-policy correction and DAPO" flags that contradict each other."""
    check = common.check
    check(
        args.overlong_buffer < args.max_tokens,
        f"--overlong-buffer {args.overlong_buffer} must be < --max-tokens {args.max_tokens}",
    )
    check(
        args.target_language == "en" or args.language_reward_weight > 0,
        "--target-language is --language-reward-weight's language: set that weight > 0",
    )
    check(
        args.rollout_is == "none" or args.old_log_probs == "trainer",
        "--rollout-is needs the trainer's pi_old: drop --old-log-probs engine",
    )
    check(
        args.rollout_is_floor == 0 or args.rollout_is == "mis",
        "--rollout-is-floor is a bound of --rollout-is mis",
    )
    check(
        args.rollout_is_floor < args.rollout_is_cap,
        "--rollout-is-floor must be below --rollout-is-cap",
    )
    # sample_seed's blocks: 16 rounds of 2^20 seeds a step
    check(
        args.dynamic_sampling_max_rounds < 16 and 2 * args.rollout_batch_size <= 2**20,
        "--dynamic-sampling-max-rounds must be < 16 and --rollout-batch-size <= 2^19",
    )


def sampling_flags(p):
    """The "sampling" flags of grpo.py and expert_iteration.py; -> the group."""
    g = p.add_argument_group("sampling")  # --- sampling ---
    g.add_argument(
        "--temperature",
        type=common.positive_float,
        default=None,
        help="rollout temperature; log-probs use the same",
    )
    g.add_argument(
        "--top-p", type=common.probability, default=1.0, help="nucleus sampling (keep 1.0 for RL)"
    )
    g.add_argument(
        "--min-tokens",
        type=common.nonneg_int,
        default=None,
        help="minimum response tokens (stop tokens banned before)",
    )
    g.add_argument(
        "--max-tokens", type=common.positive_int, default=None, help="maximum response tokens"
    )
    return g


def check_sampling(args):
    """The "sampling" flags that contradict each other (grpo.py's and expert_iteration.py's)."""
    common.check(
        args.min_tokens <= args.max_tokens,
        f"--min-tokens {args.min_tokens} must be <= --max-tokens {args.max_tokens}",
    )
    common.check(
        args.thinking_budget is None or args.min_tokens <= args.thinking_budget,
        f"--min-tokens {args.min_tokens} must be <= --thinking-budget {args.thinking_budget}",
    )


def tool_flags(p):
    """tools.py's "tools" flags and grpo.py's own training one; -> the group."""
    g = tools.add_flags(p)  # --- tools ---
    g.add_argument(
        "--mask-void-turns",
        action="store_true",
        help="SimpleTIR: a response with a void turn (a call with no code or expression, or an "
        "end with neither an answer nor code) stays in its group's baseline but carries no loss",
    )
    return g


def check_tools(args):
    """The training side of the "tools" flags (tools.resolve checks the rest)."""
    common.check(args.tools or not args.mask_void_turns, "--mask-void-turns needs --tools")
    # turn t of a round samples in its own stride of 2 x the batch (rollout): all in 2^20 seeds
    common.check(
        not args.tools or (args.max_tool_calls + 1) * 2 * args.rollout_batch_size <= 2**20,
        "(--max-tool-calls + 1) x 2 x --rollout-batch-size must be <= 2^20 (the step's seeds)",
    )
    common.check(
        not args.thinking_budget or 2 * 2 * args.rollout_batch_size <= 2**20,
        "--thinking-budget: 2 x 2 x --rollout-batch-size must be <= 2^20 (the step's seeds)",
    )


def eval_flags(p):
    """The "eval and logging" flags of grpo.py and expert_iteration.py; -> the group."""
    g = p.add_argument_group("eval and logging")  # --- eval and logging ---
    g.add_argument(
        "--eval-every",
        type=common.nonneg_int,
        default=None,
        help="greedy validation every N steps (0 = start/end)",
    )
    g.add_argument("--eval-n", type=common.positive_int, default=None, help="validation questions")
    validation.eval_sampling_flags(g)
    g.add_argument(
        "--grader-workers",
        type=common.nonneg_int,
        default=2,
        help="grading processes (0 = in this process)",
    )
    g.add_argument("--wandb", default=None, help="wandb project name (off when omitted)")
    return g


def systems_flags(p):
    """The "systems" flags of grpo.py and expert_iteration.py; -> the group."""
    g = p.add_argument_group("systems")  # --- systems ---
    g.add_argument(
        "--engine",
        default="vllm",
        choices=engines.ENGINES,
        help="rollout engine (hf = transformers)",
    )
    g.add_argument(
        "--eager",
        action="store_true",
        help="vllm without torch.compile: fast start, slower decoding (smoke tests, debugging)",
    )
    g.add_argument(
        "--policy-device", default=None, help="trained policy's device; default cuda:0, else cpu"
    )
    g.add_argument(
        "--vllm-device",
        default=None,
        help="engine device; default cuda:1 with 2 GPUs, else the policy's",
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=common.probability,
        default=None,
        help="engine GPU share; default sized",
    )
    g.add_argument(
        "--sleep-engine",
        action="store_true",
        help="one shared GPU: free the engine's memory while training",
    )
    g.add_argument(
        "--shared-prefix",
        action=common.argparse.BooleanOptionalAction,
        default=None,
        help="run each group's prompt once for its G responses (exact); default: on for CPU",
    )
    g.add_argument(
        "--threads",
        type=common.thread_count,
        default=None,
        help="torch CPU threads (default: torch's, one per core); 1 on a busy shared machine",
    )
    return g


def check_systems(args):
    """The "systems" flags that contradict each other (grpo.py's and expert_iteration.py's)."""
    check = common.check
    check(
        not (args.shared_prefix and args.gradient_checkpointing),
        "--shared-prefix runs the prompt once into the KV cache, which gradient checkpointing"
        " turns off: pass --no-shared-prefix or drop --gradient-checkpointing",
    )
    check(
        args.sleep_engine is False or args.engine == "vllm",
        "--sleep-engine frees vLLM's GPU memory: use --engine vllm",
    )
    hardware.check_device("--policy-device", args.policy_device)
    hardware.check_device("--vllm-device", args.vllm_device)
    hardware.check_attn_implementation(
        args.attn_implementation, args.policy_device, args.shared_prefix
    )


def run_flags(p):
    """The "run" flags of grpo.py and expert_iteration.py; -> the group."""
    g = p.add_argument_group("run")  # --- run ---
    g.add_argument(
        "--seed",
        type=common.nonneg_int,
        default=0,
        help="seeds prompt sampling, engine sampling, shuffling, torch",
    )
    g.add_argument(
        "--out",
        default=None,
        help="run dir (args.json, metrics.jsonl, rollouts/, dashboard.png, checkpoint/)",
    )
    g.add_argument(
        "--save-every",
        type=common.nonneg_int,
        default=None,
        help="checkpoint every N steps (0 = only at the end)",
    )
    g.add_argument(
        "--keep-checkpoints",
        type=common.nonneg_int,
        default=0,
        help="also keep the weights of the last N saves as checkpoints/step_NNNN (0 = none)",
    )
    g.add_argument(
        "--resume",
        default=None,
        help="run dir (or its checkpoint/) to continue, with its saved flags",
    )
    g.add_argument(
        "--dry-run", action="store_true", help="print the effective settings as JSON and exit"
    )
    return g


def check_run(args):
    """The "run" flags that contradict each other, each naming the fix."""
    check_keep_checkpoints(args)
    lora.check_export_dir(args)  # the user's files there are never overwritten
    # one line now, not an ImportError once the model and engine have loaded (sft.py's check)
    common.check(
        not args.wandb or importlib.util.find_spec("wandb"),
        "--wandb needs the wandb package (pip install wandb)",
    )
    # sample_seed's blocks: 16 bits each for --seed and the step
    common.check(
        args.seed < SEED_SPACE and args.n_grpo_steps < SEED_SPACE,
        f"--seed and --n-grpo-steps must be < {SEED_SPACE}",
    )


def check_keep_checkpoints(args):
    """--keep-checkpoints keeps saves: it needs --save-every (grpo.py's and expert_iteration.py's
    check)."""
    common.check(
        not args.keep_checkpoints or args.save_every,
        "--keep-checkpoints keeps the --save-every checkpoints: set --save-every N",
    )


def resolve(args):
    """Flags -> the run's settings: profile defaults, then what the run derives from them (sizes,
    the frozen models it keeps, whether it needs pi_old), then each group's check, each a one-line
    error naming the fix. Nothing is loaded. After this, args is read, never written."""
    if data.is_embedded(args.model):
        args.profile = "demo"
    else:
        args.profile = "hub"
    # where the KL to the reference policy acts: in the loss, in the reward, or only logged
    args.kl_in_loss = args.kl_beta > 0 and args.kl_in == "loss"
    args.kl_in_reward = args.kl_beta > 0 and args.kl_in == "reward"
    # the rewards -> advantages phase reads pi_t and pi_ref (a fork's policy-aware reward sets it)
    args.advantages_read_log_probs = args.kl_in_reward
    args.needs_ref = args.kl_beta > 0 or args.kl_every > 0 or args.advantages_read_log_probs
    # frozen copies of the policy to keep: pi_init, and pi_{t-1} (KL monitoring's previous policy).
    # None with LoRA: pi_init is the policy with its adapters off, pi_{t-1} a copy of the adapters
    args.frozen_models = 0
    if args.needs_ref and not args.lora_rank:
        args.frozen_models += 1
    if args.kl_every > 0 and not args.lora_rank:
        args.frozen_models += 1
    lora.check_flags(args)
    # a resumed run loads its checkpoint: its --model is needed only as the KL reference, or as
    # the base of a LoRA checkpoint's adapter
    resumed_without_kl = args.resume and not args.frozen_models and not args.lora_rank
    if not resumed_without_kl:
        args.model = common.check_model_dir(args.model or data.EMBEDDED_MODEL)
    defaults = {**PROFILES["hub"], **PROFILES[args.profile], **TASK_PROFILES.get(args.task, {})}
    if args.kl_in == "reward":
        defaults["kl_estimator"] = "k1"  # the penalty sums log pi - log pi_ref per response
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.resume:  # a finished 6-step run resumed to 3 would log an eval of the step-6 model
        done = common.read_json(os.path.join(args.resume, "state.json"), "step")["step"]
        common.check(
            args.n_grpo_steps >= done,
            f"--resume {args.resume}: its checkpoint has trained {done} steps, more than "
            f"--n-grpo-steps {args.n_grpo_steps}: pass --n-grpo-steps {done} or more",
        )
    task = data.task_defaults(args.task, args.model)
    tools.resolve(args, task)  # --prompt's default, --tools' defaults and checks
    args.reward = args.reward or task["reward"]
    args.train_path = args.train_path or task["path"]
    args.val_path = args.val_path or task["path"]
    # a missing prompt: one line now, not a traceback once the model is loaded
    common.attempt(data.load_prompt, args.prompt, what=f"--prompt {args.prompt}")
    args.normalize_constant = args.normalize_constant or float(args.max_tokens)
    if not args.out:  # (--resume has set it to its run)
        args.out = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))

    # derived sizes (check_optimisation says what to change when they do not divide)
    check_optimisation(args)
    args.micro_train_batch_size = args.train_batch_size // args.gradient_accumulation_steps
    args.n_prompts_per_rollout_batch = args.rollout_batch_size // args.group_size
    args.optimizer_steps_per_rollout_batch = (
        args.epochs_per_rollout_batch * args.rollout_batch_size // args.train_batch_size
    )
    # every optimizer step after the first trains on data from an older policy
    args.off_policy = args.optimizer_steps_per_rollout_batch > 1
    args.adv_std = adv_std(args)
    # pi_old by a no-grad pass (seed 000 asks for it on-policy too)
    args.needs_old = losses.LOSSES[args.loss].needs_old or args.rollout_is != "none"

    check_data(args)
    check_loss(args)
    check_correction(args)
    check_sampling(args)
    check_tools(args)
    check_systems(args)
    check_run(args)
    args.tool_isolated = tools.isolated(args)  # last: it may start a probe call
    return args


# ----------------------------------------------------------------------------- setup
def setup_runtime(args):
    """The runtime record: what this process decides from the flags and its own GPUs (a Ray actor
    sees only its own), kept apart from args and saved as runtime.json; it applies --threads. The
    policy on cuda:0 and the engine on cuda:1 with 2 GPUs (seed 000's layout); with one GPU they
    share it; else CPU. load_policy may turn shared_prefix off for a model whose cache does not
    reproduce its log-probs, and make_engine sets engine to hf for a model vLLM's CPU engine
    cannot run."""
    n_gpu = torch.cuda.device_count()
    policy_device = args.policy_device
    if policy_device is None:
        policy_device = "cpu"
        if n_gpu:
            policy_device = "cuda:0"
    vllm_device = args.vllm_device
    if vllm_device is None:
        vllm_device = policy_device
        if n_gpu > 1:
            vllm_device = "cuda:1"
    param_dtype, compute_dtype = hardware.resolve_precision(
        policy_device, args.dtype, args.pure_bf16
    )
    lora.check_device(args, policy_device)
    # on CUDA the saving is only the prompt's share of a long response: see docs/shared_prefix.md
    shared_prefix = args.shared_prefix
    if shared_prefix is None:
        # the shared prefix needs the KV cache, which gradient checkpointing turns off
        shared_prefix = policy_device == "cpu" and not args.gradient_checkpointing
    print(
        f"devices: policy {policy_device} (weights {param_dtype}, compute {compute_dtype}), "
        f"engine {args.engine} on {vllm_device} ({n_gpu} GPUs visible)"
    )
    # before the engine starts (a vLLM CPU engine makes torch.set_num_threads a no-op)
    threads = hardware.set_threads(args.threads)
    return {
        "engine": args.engine,  # make_engine records the one that runs
        "policy_device": policy_device,
        "vllm_device": vllm_device,
        "param_dtype": param_dtype,
        "compute_dtype": compute_dtype,
        "shared_prefix": shared_prefix,
        "gpus_visible": n_gpu,
        "threads": threads,
    }


def load_data(args):
    """(train rows, validation rows), each row with its formatted "prompt" (load_rows). Missing or
    empty data, or fewer questions than a rollout batch, is a one-line error."""
    train, val = load_rows(args)
    fix = "more data or a smaller --rollout-batch-size"
    if args.pass_rates:
        fix = "a wider --keep-pass-rate, more data or a smaller --rollout-batch-size"
    common.check(
        len(train) >= args.n_prompts_per_rollout_batch,
        f"{len(train)} train questions < {args.n_prompts_per_rollout_batch} prompts per rollout"
        f" batch: {fix}",
    )
    if args.train_path == "synthetic":
        print(
            f"data: synthetic Countdown (data.generate_countdown), {len(train)} train / "
            f"{len(val)} test problems"
        )
    return train, val


def load_rows(args):
    """The "model and data" flags' (train rows, validation rows), for grpo.py and
    expert_iteration.py: --train-n train and --eval-n validation questions, each row with its
    formatted "prompt" (in the chat template with --chat-template); with --pass-rates, the train
    rows --keep-pass-rate keeps. Missing data, a pass-rate file without some training prompt or an
    empty validation set is a one-line error."""
    train = common.attempt(
        data.load_task,
        args.task,
        "train",
        args.train_path,
        args.train_n or None,
        args.data_seed,
        prompt=args.prompt,
        what="--train-path",
    )
    val = common.attempt(
        data.load_task,
        args.task,
        "test",
        args.val_path,
        args.eval_n,
        args.data_seed,
        prompt=args.prompt,
        what="--val-path",
    )
    # --chat-template: the prompts as the model's chat turns (a checkpoint holds the tokenizer)
    tokenizer_path = args.resume or args.model
    train = common.attempt(
        data.apply_chat_template, train, tokenizer_path, args.chat_template, what="--chat-template"
    )
    val = common.attempt(
        data.apply_chat_template, val, tokenizer_path, args.chat_template, what="--chat-template"
    )
    common.check(len(val) > 0, "the validation set is empty: check --val-path")
    if args.pass_rates:  # the offline difficulty filter, on the prompts as formatted
        low, high = args.keep_pass_rate
        loaded = len(train)
        keep = data.keep_by_pass_rate
        train = common.attempt(keep, train, args.pass_rates, low, high, what="--pass-rates")
        print(
            f"data: kept {len(train)} of {loaded} prompts, those with a pass rate in "
            f"[{low:g}, {high:g}] ({args.pass_rates})"
        )
        common.check(train, f"--keep-pass-rate {low:g} {high:g} keeps no prompt: widen it")
    return train, val


def load_policy(path, args, runtime, dtype=None):
    """-> (HF causal LM on the runtime's policy device, its tokenizer). The model is in `dtype`
    (default: the master-weight dtype) with dropout off: RL scores pi_old, pi_ref and pi (the
    training forwards too) with one function. A model whose KV cache does not reproduce its
    log-probs turns the runtime's shared_prefix off."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=dtype or runtime["param_dtype"],
        attn_implementation=args.attn_implementation,
    )
    policy = policy.to(runtime["policy_device"])
    if args.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    policy.config.use_cache = False
    tokenizer = AutoTokenizer.from_pretrained(path)
    n_embeddings = policy.get_input_embeddings().weight.shape[0]
    common.check(
        len(tokenizer) <= n_embeddings,
        f"{path}: the tokenizer has {len(tokenizer)} tokens but the model only {n_embeddings}"
        " embeddings",
    )
    if runtime["shared_prefix"] and not losses.shared_prefix_works(policy):
        runtime["shared_prefix"] = False
        print("notice: --shared-prefix off (this model's cache did not reproduce its log-probs)")
    for module in policy.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        # HF attention modules keep their dropout as a float
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    return policy.train(), tokenizer


def build_learner(args, runtime, mesh=None):
    """The learner of grpo.py and of each grpo_ray.py learner actor: {"policy", "tokenizer",
    "optimizer" (AdamW), "ref_model" (frozen pi_init or None), "prev_model" (frozen pi_{t-1} or
    None)}. With LoRA the base is in the compute dtype (frozen: no fp32 master copy), the optimizer
    holds the fp32 adapters only, "ref_model" is the policy itself (train_step turns its adapters
    off) and pi_{t-1} is "prev_adapters": {"step", "weights"} (lora.adapter_state).
    mesh (grpo_ray.py --learner-sharding fsdp: the learners' DeviceMesh): the policy and the frozen
    models sharded over it (sharding.shard) before the optimizer is built, and a resumed run's
    weights and AdamW state are this learner's shard of its checkpoint."""
    dtype = None  # the master-weight dtype
    if args.lora_rank:
        dtype = runtime["compute_dtype"]
    path = lora.model_path(args)
    if mesh is not None:
        path = args.model  # a sharded checkpoint holds shards, loaded below, not a model
    policy, tokenizer = load_policy(path, args, runtime, dtype)
    policy = lora.wrap(policy, args)  # LoRA: adapters, from --resume's checkpoint if resumed
    if mesh is not None:
        policy = sharding.shard(policy, mesh)
    optimizer = torch.optim.AdamW(
        lora.trainable(policy), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95)
    )
    # every grpo_ray.py learner loads the one checkpoint: the group stays in lockstep
    if args.resume:
        if mesh is None:
            saved = torch.load(os.path.join(args.resume, "optimizer.pt"), map_location="cpu")
        else:
            rank = mesh.get_local_rank()
            path = sharding.local_path(args.resume, rank, mesh.size())
            saved = sharding.load_shard(path, policy, lora.trainable(policy))
        optimizer.load_state_dict(saved)
        # this run's --lr (a resume may override it): the saved groups hold the old one
        for group in optimizer.param_groups:
            group["lr"] = args.lr
            group["initial_lr"] = args.lr
    # the frozen models keep the policy's own weight dtype (fp32 master weights stay fp32) and run
    # under the same autocast: at step 0 KL(pi || pi_init) and its gradient are exactly 0, not
    # bf16 rounding
    frozen = []
    for _ in range(args.frozen_models):
        model = load_policy(args.model, args, runtime)[0]
        if mesh is not None:
            model = sharding.shard(model, mesh)
        frozen.append(model.eval().requires_grad_(False))
    learner = {
        "policy": policy,
        "tokenizer": tokenizer,
        "optimizer": optimizer,
        "ref_model": None,
        "prev_model": None,
    }
    if len(frozen) >= 1:
        learner["ref_model"] = frozen[0]
    if len(frozen) >= 2:
        learner["prev_model"] = frozen[1]
    if args.lora_rank and args.needs_ref:
        learner["ref_model"] = policy  # pi_init: the base, read with lora.adapters_off
    return learner


def make_engine(path, args, runtime, policy=None):
    """rollout.init_engine for this run. On one shared GPU the engine's share leaves room for the
    policy. runtime["engine"] becomes the engine that runs: hf for a model vLLM's CPU engine cannot
    run (rollout.engine_that_runs; checked here, not in setup_runtime, as it imports vLLM)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    max_len = min(getattr(config, "max_position_embeddings", 4096), 4096)
    kw = {}
    device = runtime["vllm_device"]
    engine = engines.engine_that_runs(args.engine, path, device)
    runtime["engine"] = engine  # the run record (runtime.json) names the engine that runs
    if engine == "vllm":
        kw["max_model_len"] = max_len
        kw["enforce_eager"] = args.eager
    if engine == "vllm" and device.startswith("cuda"):
        share = args.gpu_memory_utilization
        if not share:
            share = hardware.engine_share(
                runtime["policy_device"],
                device,
                runtime["param_dtype"],
                args.sleep_engine,
                policy,
                extra_models=args.frozen_models,
            )
        kw["gpu_memory_utilization"] = share
        kw["enable_sleep_mode"] = args.sleep_engine
    return engines.init_engine(engine, path, device=device, seed=args.seed, **kw)


# ----------------------------------------------------------------------------- 1. rollout + reward
def sample_seed(args, step, rnd=0):
    """The first sampling seed of step `step`, round `rnd`. Each (step, round) owns a block of
    2^20 seeds, disjoint from all others; a generate call uses [seed, seed + prompts x G)."""
    return ((args.seed * SEED_SPACE + step) * 16 + rnd) * 2**20


def rollout(engine, rows, args, seed, tool=None):
    """G samples of each row's prompt -> batch: a dict of group-major lists (N = rows x G).
    With a tool (--tools) the samples are tools.generate's multi-turn ones: "responses" holds the
    policy's own text (what is graded), "transcripts" the text with the tool output, and
    "policy_masks" which response tokens the engine sampled. With --thinking-budget they are
    tools.generate_thinking's: "policy_masks" (0 on an appended </think>) and "thinking_cut"."""
    prompts = [row["prompt"] for row in rows]
    sampling = {
        "n": args.group_size,
        "temperature": args.temperature,
        "seed": seed,
        "top_p": args.top_p,
        "max_tokens": args.max_tokens,
        "min_tokens": args.min_tokens,
        "stop": rows[0]["stop"],
    }
    thinking = tools.thinking(args)  # --thinking-budget, else None
    if tool is None and thinking is None:
        outs = engines.generate(engine, prompts, **sampling)
    elif tool is None:
        stride = 2 * args.rollout_batch_size  # turn 1's seeds, as a tool run's
        outs = tools.generate_thinking(engine, prompts, thinking, turn_stride=stride, **sampling)
    else:
        # turn t's seeds sit t strides past turn 0's: every shard's and round's block is disjoint
        stride = 2 * args.rollout_batch_size
        outs = tools.generate(engine, prompts, tool, turn_stride=stride, **sampling)
    batch = {
        "prompts": [],
        "ground_truths": [],
        "responses": [],
        "prompt_ids": [],
        "response_ids": [],
        "engine_logprobs": [],
        "truncated": [],
    }
    if tool is not None:
        for key in TOOL_KEYS:
            batch[key] = []
    if thinking is not None:
        batch["policy_masks"] = []
        batch["thinking_cut"] = []
    for row, samples in zip(rows, outs):
        for sample in samples:  # group-major: a prompt's G samples one after the other
            batch["prompts"].append(row["prompt"])
            batch["ground_truths"].append(row["ground_truth"])
            batch["responses"].append(sample["text"])
            batch["prompt_ids"].append(sample["prompt_token_ids"])
            batch["response_ids"].append(sample["token_ids"])
            batch["engine_logprobs"].append(sample["logprobs"])
            # out of tokens: cut at --max-tokens, or a tool output that did not fit
            finish = sample["finish_reason"]
            batch["truncated"].append(finish in ("length", "truncated_by_tool"))
            if tool is not None:
                batch["responses"][-1] = sample["policy_text"]
                batch["transcripts"].append(sample["text"])
                batch["policy_masks"].append(sample["policy_mask"])
                batch["truncated_by_tool"].append(finish == "truncated_by_tool")
                for key in ("calls", "errors", "timeouts", "turns", "obs_tokens", "void"):
                    batch[key].append(sample[key])
            if thinking is not None:
                batch["policy_masks"].append(sample["policy_mask"])
                batch["thinking_cut"].append(sample["thinking_cut"])
    return batch


# a tool run's extra batch columns (rollout), one value per sample
TOOL_KEYS = (
    "transcripts",
    "policy_masks",
    "truncated_by_tool",
    "calls",
    "errors",
    "timeouts",
    "turns",
    "obs_tokens",
    "void",
)


def score(batch, args):
    """Grade every response, and add the shaping terms asked for: DAPO's overlong penalty, Kimi
    k1.5's length reward (batch["length_reward"] (N,), weighted), DeepSeek-R1's language
    consistency (batch["language_fraction"], N floats); they add up. Sets batch["rewards"] (the
    reward dicts), batch["raw"] (N,), the total rewards, and batch["correct"] (grader.is_correct
    of each); returns the batch. Reward shaping goes here: batch["raw"] is what advantages read.
    The overlong penalty's length is the response's tokens (with --tools, tool output included);
    the length reward's, the tokens the policy sampled (batch["policy_masks"] when there are
    any: train/response_len_mean's count). A group is G consecutive rows."""
    reward_fn = grader.REWARD_FNS[args.reward]
    dicts = grader.grade_batch(
        reward_fn, batch["responses"], batch["ground_truths"], workers=args.grader_workers
    )
    raw = torch.tensor([d["reward"] for d in dicts], dtype=torch.float32)  # (N,)
    if args.overlong_buffer:
        # 0 up to max_tokens - buffer tokens, then linear down to -1 at max_tokens
        lengths = [len(ids) for ids in batch["response_ids"]]
        n = torch.tensor(lengths, dtype=torch.float32)  # (N,)
        left = args.max_tokens - args.overlong_buffer - n  # (N,) below 0 inside the buffer
        raw += (left / args.overlong_buffer).clamp(-1.0, 0.0)
    correct = [grader.is_correct(d) for d in dicts]
    if args.length_reward_weight:
        # within each group, the shorter correct responses gain and the longer ones lose; a
        # length is what the policy wrote (not a tool's output, not an appended </think>)
        lengths = [len(ids) for ids in batch["response_ids"]]
        if "policy_masks" in batch:
            lengths = [sum(mask) for mask in batch["policy_masks"]]
        unweighted = losses.kimi_length_reward(lengths, correct, args.group_size)  # (N,)
        batch["length_reward"] = args.length_reward_weight * unweighted
        raw += batch["length_reward"]
    if args.language_reward_weight:
        fractions = []  # of each response's reasoning words in the target language
        for response in batch["responses"]:
            fractions.append(grader.language_fraction(response, args.target_language))
        batch["language_fraction"] = fractions
        raw += args.language_reward_weight * torch.tensor(fractions, dtype=torch.float32)
    batch["rewards"] = dicts
    batch["raw"] = raw
    batch["correct"] = correct
    return batch


def count_groups(part, args):
    """(groups, all correct, all wrong) among a scored part's groups of G consecutive rows."""
    G = args.group_size
    correct = part["correct"]
    n = len(correct) // G
    all_correct = 0
    all_wrong = 0
    for g in range(n):
        right = sum(correct[g * G : (g + 1) * G])
        if right == G:
            all_correct += 1
        if right == 0:
            all_wrong += 1
    return n, all_correct, all_wrong


def varied_groups(batch, args):
    """(n_groups,) bool: does the --dynamic-sampling-on score vary within each group of G rows?
    (DAPO: the accuracy.)"""
    if args.dynamic_sampling_on == "answer_reward":
        answer_rewards = [d["answer_reward"] for d in batch["rewards"]]
        signal = torch.tensor(answer_rewards, dtype=torch.float32)  # (N,)
    else:
        signal = batch["raw"]  # (N,) the total reward, length shaping included
    grouped = signal.view(-1, args.group_size)  # (n_groups, G)
    return grouped.amax(dim=1) > grouped.amin(dim=1)


def _drop_flat_groups(part, room, args):
    """DAPO's dynamic-sampling filter on a scored batch: keeps the first `room` groups whose score
    varies within the group. -> (the kept groups as a batch, the number of flat groups)."""
    G = args.group_size
    varied = varied_groups(part, args).tolist()
    keep = []  # the varied groups' rows
    for g, group_varies in enumerate(varied):
        if group_varies:
            keep.extend(range(g * G, (g + 1) * G))
    n_flat = varied.count(False)
    keep = keep[: room * G]
    kept = {}
    for key, values in part.items():
        if torch.is_tensor(values):
            kept[key] = values[keep]
        else:
            kept[key] = [values[j] for j in keep]
    return kept, n_flat


class Curriculum:
    """Kimi k1.5's sampling by success rate, seed 003's "curriculum" (--curriculum): a step's
    prompts are drawn without replacement with weight w = max(--curriculum-floor, 1 - s), s the
    prompt's running success rate, an exponential average of its groups' fractions correct:
    s <- d s + (1 - d) f, with d = --curriculum-decay, from s = 0.5 for a prompt not yet drawn.
    One sampler per run, where
    the step's prompts are chosen (grpo.py's loop; grpo_ray.py's driver, which hands every
    generator the step's choice), updated once per step from every group the step scored; `state()`
    is saved in the checkpoint's state.json and resumed from it (`saved`)."""

    def __init__(self, train_rows, args, saved=None):
        self.args = args
        self.success = [0.5] * len(train_rows)  # s of each train row, 0.5 until it is drawn
        self.prompts_sha = prompts_sha(train_rows)  # which prompts, in which order, s is about
        if saved is not None:  # a resumed run's state(); before prompts_sha: the bare list
            success = saved
            if isinstance(saved, dict):
                success = saved["success"]
            common.check(
                len(success) == len(train_rows),
                f"--resume: its curriculum holds {len(success)} prompts, the training data "
                f"{len(train_rows)}: resume with the run's --train-path, --train-n, --pass-rates",
            )
            common.check(
                not isinstance(saved, dict) or saved["prompts_sha"] == self.prompts_sha,
                "--resume: its curriculum's prompts differ from the training data's (text or "
                "order): resume with the run's --data-seed, --pass-rates, --keep-pass-rate",
            )
            self.success = list(success)
        self.rows_of = {}  # prompt text -> its train rows (the same prompt twice: both move)
        for i, row in enumerate(train_rows):
            self.rows_of.setdefault(row["prompt"], []).append(i)

    def weights(self):
        """(n_rows,) float64: max(floor, 1 - s) of each train row."""
        s = torch.tensor(self.success, dtype=torch.float64)  # (n_rows,)
        return (1 - s).clamp(min=self.args.curriculum_floor)

    def choose(self, step):
        """Step `step`'s prompts, all shards': --rollout-batch-size / G train-row indices drawn
        without replacement by weight, seeded by the step's sample_seed."""
        gen = torch.Generator().manual_seed(sample_seed(self.args, step))
        total = self.args.n_prompts_per_rollout_batch
        picks = torch.multinomial(self.weights(), total, replacement=False, generator=gen)
        return picks.tolist()

    def update(self, outcomes):
        """Each (prompt, fraction correct) of a step's scored groups (collect's
        stats["group_outcomes"], all shards' in order) moves its prompt's s towards the fraction:
        every group scored, so under --dynamic-sampling the flat groups it dropped too (an
        always-solved prompt's s rises)."""
        d = self.args.curriculum_decay
        for prompt, frac in outcomes:
            for i in self.rows_of[prompt]:
                self.success[i] = d * self.success[i] + (1 - d) * frac

    def state(self):
        """What a checkpoint saves: {"prompts_sha", "success"}."""
        return {"prompts_sha": self.prompts_sha, "success": list(self.success)}


def prompts_sha(train_rows):
    """A short hash of the training prompts in order: a resumed curriculum's rates are theirs."""
    prompts = [row["prompt"] for row in train_rows]
    return hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16]


def group_outcomes(part, args):
    """[(prompt, fraction correct)] of each group of G consecutive rows of a scored part."""
    G = args.group_size
    outcomes = []
    for g in range(len(part["correct"]) // G):
        outcomes.append((part["prompts"][g * G], fmean(part["correct"][g * G : (g + 1) * G])))
    return outcomes


def start_curriculum(train_rows, args, state):
    """--curriculum's sampler (Curriculum), with the success rates of a resumed run's checkpoint
    (`state`, as start_state returns it) when it has them; None without --curriculum."""
    if not args.curriculum:
        return None
    return Curriculum(train_rows, args, state.get("curriculum"))


def shard_prompts(train_rows, args, step, shard, picks):
    """(index of this shard's first prompt, its prompts) among the step's: a uniform draw seeded
    by the step, or the curriculum's picks (train_rows indices); shard (i, n) takes its part."""
    i, n = shard
    total = args.n_prompts_per_rollout_batch  # the step's prompts, over all shards
    start = i * total // n  # this shard's first prompt
    end = (i + 1) * total // n
    if picks is None:
        chosen = random.Random(sample_seed(args, step)).sample(train_rows, total)
    else:
        chosen = [train_rows[j] for j in picks]
    return start, chosen[start:end]


def _join_parts(batch, part):
    """The groups kept so far (None before the first round) with a round's kept groups after."""
    if batch is None:
        return part
    joined = {}
    for key, values in part.items():
        if torch.is_tensor(values):
            joined[key] = torch.cat([batch[key], values])
        else:
            joined[key] = batch[key] + values
    return joined


def collect(engine, train_rows, args, step, shard=(0, 1), tool=None, picks=None):
    """The rollout and reward phases of a step -> (scored batch, this shard's stats: its seconds
    of generation, grading, tool calls and extra rounds, prompts sampled, flat groups dropped,
    all-correct and all-wrong groups, and every group's (prompt, fraction correct), the dropped
    ones too: what the curriculum learns from). `summarize` turns the joined batch into the
    step's rollout metrics. tool: the run's tools.Tool (--tools), else None. picks: the step's
    prompts over all shards as train_rows indices (--curriculum: Curriculum.choose), else None: a
    uniform draw.

    --dynamic-sampling (DAPO) drops the groups whose score does not vary and samples fresh prompts
    to fill their place, for up to --dynamic-sampling-max-rounds more rounds; then it trains what
    it has. shard (i, n): generator i of n (grpo_ray.py) takes its part of the step's prompts and
    seeds; the n parts joined in order are one batch.
    """
    i = shard[0]
    G = args.group_size
    start, rows = shard_prompts(train_rows, args, step, shard, picks)
    rng = random.Random(f"{sample_seed(args, step)}-{i}")  # extra rounds: this shard's own draws
    n_rounds = 1
    if args.dynamic_sampling:
        n_rounds += args.dynamic_sampling_max_rounds

    want = len(rows)  # groups this shard trains on
    batch = None  # the groups kept so far
    flat = None  # the last round's groups, unfiltered (trained if no group varies)
    sampled = 0  # prompts sampled, over all rounds
    n_flat = 0  # sampled groups dropped for no variance (--dynamic-sampling)
    all_correct = 0  # sampled groups whose every response is correct (before the filter)
    all_wrong = 0  # sampled groups with no correct response
    outcomes = []  # every sampled group's (prompt, fraction correct), before the filter
    t0 = time.perf_counter()
    t_grade = 0.0
    t_tool = 0.0
    t_round0 = None  # the first round's time: the rest is dynamic sampling's extra
    for rnd in range(n_rounds):
        # a shard uses at most 2 x its prompts x G seeds of the round's block (a later round
        # samples up to twice the prompts it misses): shard i's part starts at 2 x start x G
        tool_s = 0.0
        if tool is not None:
            tool_s = tool.seconds
        part = rollout(engine, rows, args, sample_seed(args, step, rnd) + 2 * start * G, tool)
        if tool is not None:
            t_tool += tool.seconds - tool_s
        t1 = time.perf_counter()
        part = score(part, args)
        sampled += len(rows)
        _, right, wrong = count_groups(part, args)
        all_correct += right
        all_wrong += wrong
        outcomes += group_outcomes(part, args)
        t_grade = t_grade + time.perf_counter() - t1
        if args.dynamic_sampling:
            # keep the groups with variance, up to the batch size
            have = 0
            if batch is not None:
                have = len(batch["raw"]) // G
            flat = part
            part, n_dropped = _drop_flat_groups(flat, want - have, args)
            n_flat += n_dropped
        batch = _join_parts(batch, part)
        if t_round0 is None:
            t_round0 = time.perf_counter() - t0
        missing = want - len(batch["raw"]) // G
        if not args.dynamic_sampling or missing <= 0:
            break
        # oversample: some of the groups come out flat (uniformly, also with --curriculum)
        rows = rng.sample(train_rows, min(len(train_rows), 2 * missing))
    if len(batch["raw"]) == 0:
        # nothing to learn from in this step: train a batch's worth of flat groups (advantages
        # gives them zero advantages)
        print(
            f"notice: step {step}: no group with {args.dynamic_sampling_on} variance in {sampled}"
            " prompts (--dynamic-sampling)"
        )
        batch = {k: v[: want * G] for k, v in flat.items()}
    if args.min_tokens:
        batch["ban_token_ids"] = engines.min_tokens_banned_ids(engine)  # the trainer bans them too
    else:
        batch["ban_token_ids"] = []
    stats = {
        "generation_s": time.perf_counter() - t0 - t_grade - t_tool,
        "grading_s": t_grade,
        "tool_s": t_tool,
        "extra_rounds_s": time.perf_counter() - t0 - t_round0,
        "prompts_sampled": sampled,
        "groups_flat": n_flat,
        "groups_all_correct": all_correct,
        "groups_all_wrong": all_wrong,
        "group_outcomes": outcomes,
    }
    return batch, stats


# ----------------------------------------------------------------------------- 2. rollout metrics
def summarize(batch, shard_stats, args):
    """The one place where a step's scored batch (all its shards joined) is summarised into the
    step's rollout metrics; grpo_ray.py calls it on its generators' joined shards. shard_stats:
    collect's stats of each shard (one for grpo.py; the shards ran side by side, so a time is their
    longest). The batch: G consecutive rows per prompt, batch["raw"] (N,) the rewards. A new metric
    is an entry in metric_table.METRICS and one line here."""
    lengths = [len(ids) for ids in batch["response_ids"]]  # every response token
    if "policy_masks" in batch:
        lengths = [sum(mask) for mask in batch["policy_masks"]]  # the tokens the policy sampled
    rewards = batch["rewards"]
    stats = losses.reward_stats(batch["raw"], args.group_size)
    groups = sum(s["prompts_sampled"] for s in shard_stats)  # every group sampled, all rounds
    metrics = {
        "train/reward": stats["mean"],
        "train/format_reward": fmean([d["format_reward"] for d in rewards]),
        "train/answer_reward": fmean([d["answer_reward"] for d in rewards]),
        "train/zero_var_frac": stats["frac_groups_zero_std"],
        "train/all_correct_frac": sum(s["groups_all_correct"] for s in shard_stats) / groups,
        "train/all_wrong_frac": sum(s["groups_all_wrong"] for s in shard_stats) / groups,
        "train/response_len_mean": fmean(lengths),
        "train/response_len_max": max(lengths),
        "train/truncation_rate": fmean(batch["truncated"]),
        "time/generation": max(s["generation_s"] for s in shard_stats),
        "time/grading": max(s["grading_s"] for s in shard_stats),
    }
    if args.dynamic_sampling:
        sampled = sum(s["prompts_sampled"] for s in shard_stats)
        flat = sum(s["groups_flat"] for s in shard_stats)
        metrics["train/dynamic_filtered_frac"] = flat / sampled
        metrics["train/dynamic_prompts_sampled"] = sampled
        metrics["time/dynamic_extra_generation"] = max(s["extra_rounds_s"] for s in shard_stats)
    if args.length_reward_weight:
        metrics["train/length_reward"] = batch["length_reward"].mean().item()
    if args.language_reward_weight:
        metrics["train/language_fraction"] = fmean(batch["language_fraction"])
    if "calls" in batch:  # --tools
        metrics |= tool_metrics(batch)
        metrics["time/tool"] = max(s["tool_s"] for s in shard_stats)
    if "thinking_cut" in batch:
        metrics["train/thinking_cut_frac"] = fmean(batch["thinking_cut"])
    return metrics


def tool_metrics(batch):
    """The tool/ metrics of a --tools batch (rollout's TOOL_KEYS columns); rates per call, or per
    sample where it says so."""
    calls = sum(batch["calls"])
    metrics = {
        "tool/calls_mean": fmean(batch["calls"]),
        "tool/calls_max": max(batch["calls"]),
        "tool/frac_with_call": fmean([c > 0 for c in batch["calls"]]),
        "tool/error_rate": sum(batch["errors"]) / max(calls, 1),
        "tool/timeout_rate": sum(batch["timeouts"]) / max(calls, 1),
        "tool/turns_mean": fmean(batch["turns"]),
        "tool/truncated_by_tool_rate": fmean(batch["truncated_by_tool"]),
        "tool/obs_tokens_mean": fmean(batch["obs_tokens"]),
        "tool/void_turn_rate": fmean(batch["void"]),
        "train/response_len_total_mean": fmean([len(ids) for ids in batch["response_ids"]]),
    }
    return metrics


# ---------------------------------------- (eval) on the engine's weights, before train changes them
def evaluate_and_dump(engine, val_rows, args, step, state, t_run, batch, wandb_run, tool=None):
    """Greedy validation on the engine's weights (with the run's tool, if any): logs the eval/ row
    and prints its line, then writes rollouts/step_NNNN.jsonl (32 validation samples, then the
    first 2 train groups of `batch` when given; with a tool each response is its transcript).
    -> the seconds it took (not counted as step time)."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    metrics, samples = validation.greedy_eval(
        engine,
        val_rows,
        args.reward,
        args.max_tokens,
        args.min_tokens,
        args.grader_workers,
        tool=tool,
        thinking=tools.thinking(args),
    )
    sampled = ""
    if args.eval_samples:
        metrics |= validation.sampled_eval(
            engine,
            val_rows,
            args.reward,
            args.eval_samples,
            args.eval_temperature,
            args.max_tokens,
            args.min_tokens,
            args.grader_workers,
            args.seed,
            tool=tool,
            thinking=tools.thinking(args),
        )
        k = args.eval_samples
        sampled = (
            f" | avg@{k} {metrics['eval/avg@k']:.3f} | pass@{k} {metrics['eval/pass@k']:.3f} | "
            f"maj@{k} {metrics['eval/maj@k']:.3f}"
        )
    row = {
        "step": step,
        "opt_step": state["opt_step"],
        "time/wall": time.perf_counter() - t_run,
        "time/eval": time.perf_counter() - t0,
    }
    runs.log_row(args.out, row | metrics, wandb_run)
    tqdm.write(  # between the steps' progress bar and its redraw
        f"eval step {step} | accuracy {metrics['eval/accuracy']:.3f} | "
        f"reward {metrics['eval/reward']:.3f} | format {metrics['eval/format_reward']:.3f} | "
        f"len {metrics['eval/response_len']:.1f}{sampled}",
    )
    train = []
    if batch is not None:
        responses = batch.get("transcripts", batch["responses"])  # with a tool: its output too
        columns = zip(batch["prompts"], responses, batch["ground_truths"], batch["rewards"])
        for prompt, response, ground_truth, rewards in columns:
            train.append(
                {
                    "split": "train",
                    "prompt": prompt,
                    "response": response,
                    "ground_truth": ground_truth,
                    **rewards,
                }
            )
    data.write_jsonl_atomic(
        os.path.join(args.out, "rollouts", f"step_{step:04d}.jsonl"),
        samples[:32] + train[: 2 * args.group_size],
    )
    return time.perf_counter() - t0


# ----------------------------------------------------------------- 3. log-probs: the no-grad passes
def collate(batch, args, pad_id=0):
    """The engine's token ids, right-padded, as tensors: input_ids, labels, response_mask,
    policy_mask, loss_mask, engine_log_probs and ban_mask (N, T); lengths, group and prompt_len
    (N,). response_mask marks every response token, tool output included; policy_mask the ones the
    engine sampled (all of them without --tools): what a KL and the log-prob mismatch read;
    loss_mask the ones that carry the loss (the policy's, but a truncated row's under
    --mask-truncated and a void one's under --mask-void-turns): what the loss, its normalisers,
    the entropy and the ratios read.
    ban_mask marks the first --min-tokens response positions (stop tokens are banned there: in
    the first turn only, the one sampled with min_tokens)."""
    prompt_ids = batch["prompt_ids"]
    response_ids = batch["response_ids"]
    seqs = [p + r for p, r in zip(prompt_ids, response_ids)]
    N = len(seqs)
    T = max(map(len, seqs)) - 1  # label positions: a sequence predicts all but its first token
    ids = torch.full((N, T + 1), pad_id, dtype=torch.long)  # (N, T+1)
    mask = torch.zeros(N, T, dtype=torch.bool)  # (N, T) over labels: the response tokens
    policy = torch.zeros(N, T, dtype=torch.bool)  # (N, T) over labels: the sampled tokens
    ban = torch.zeros(N, T, dtype=torch.bool)  # (N, T) over labels: the first --min-tokens
    eng = torch.zeros(N, T)  # (N, T) over labels: the engine's log-probs
    for i in range(N):
        p = prompt_ids[i]
        r = response_ids[i]
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        s = len(p) - 1  # label s is the first response token
        mask[i, s : s + len(r)] = True
        if "policy_masks" in batch:
            policy[i, s : s + len(r)] = torch.tensor(batch["policy_masks"][i], dtype=torch.bool)
        else:
            policy[i, s : s + len(r)] = True
        ban[i, s : s + min(len(r), args.min_tokens)] = True
        eng[i, s : s + len(r)] = torch.tensor(batch["engine_logprobs"][i], dtype=torch.float32)
    loss_mask = policy.clone()  # (N, T)
    if args.mask_truncated:  # DAPO's overlong filtering: truncated responses leave the loss
        loss_mask[torch.tensor(batch["truncated"], dtype=torch.bool)] = False
    if args.mask_void_turns:  # SimpleTIR: responses with a void turn leave the loss
        loss_mask[torch.tensor(batch["void"], dtype=torch.bool)] = False
    return {
        "input_ids": ids[:, :-1],
        "labels": ids[:, 1:],
        "response_mask": mask,
        "policy_mask": policy,
        "loss_mask": loss_mask,
        "engine_log_probs": eng,
        "ban_mask": ban,
        "lengths": torch.tensor([len(s) - 1 for s in seqs]),
        "group": torch.arange(N) // args.group_size,
        "prompt_len": torch.tensor([len(p) for p in prompt_ids]),
    }


def forward_passes(tensors, idx, shared_prefix, device):
    """The forward passes of microbatch rows `idx` (a tensor of row numbers). Yields, for each:
    (rows, mb, L, P) with mb the rows' input_ids, labels and ban_mask trimmed to their longest
    length L and moved to `device`, plus their lengths; P is the shared prefix's length.

    Without shared_prefix this is one pass, P = 0. With it, one pass per group: its prompt runs
    once, and the prompt's last token predicts each response's first (P = the prompt's length - 1;
    0 for a single row, or when the prefix would be the whole pass).
    """
    if shared_prefix:
        group_of = tensors["group"][idx]  # (len(idx),)
        passes = []
        for g in group_of.unique():
            passes.append(idx[group_of == g])
    else:
        passes = [idx]
    for rows in passes:
        L = int(tensors["lengths"][rows].max())
        P = 0
        if shared_prefix and len(rows) > 1:
            prefix = int(tensors["prompt_len"][rows].min()) - 1
            if prefix < L:
                P = prefix
        mb = {}
        for key in ("input_ids", "labels", "ban_mask"):
            mb[key] = tensors[key][rows, :L].to(device)  # (rows, L)
        mb["lengths"] = tensors["lengths"][rows]
        yield rows, mb, L, P


def _shard(rows, dp):
    """This learner's contiguous part of `rows` (all of them without data parallelism)."""
    if dp is None:
        return rows
    start = dp["rank"] * len(rows) // dp["world"]
    end = (dp["rank"] + 1) * len(rows) // dp["world"]
    return rows[start:end]


def _microbatches(rows, dp, mbs):
    """This learner's microbatches of `rows` (tensors of row numbers, mbs rows each), each with
    whether it is a dummy. Sharded (FSDP2), every forward gathers each layer and every backward
    reduce-scatters it, collectives all learners must join: each runs as many microbatches as the
    learner with the most rows (no shared prefix there: one forward each), the missing ones dummies
    of the step's first row, whose outputs the caller discards (its loss times 0)."""
    mine = _shard(rows, dp)
    out = []
    for start in range(0, len(mine), mbs):
        out.append((mine[start : start + mbs], False))
    if dp is not None and dp.get("sharded"):
        most_rows = -(-len(rows) // dp["world"])  # ceil: _shard's largest share
        most = -(-most_rows // mbs)
        while len(out) < most:
            out.append((rows[:1], True))
    return out


def batch_log_probs(model, tensors, args, runtime, ban_ids, dp=None, rows=None, entropy=False):
    """(N, T) label log-probs under `model` at the sampling temperature, no grad; with entropy:
    the token entropies instead. Of `rows` only (the others read 0), by default all.
    With dp each learner scores its shard of the rows, and the results are summed."""
    N, T = tensors["labels"].shape
    out = torch.zeros(N, T)  # (N, T)
    device = next(model.parameters()).device
    was_training = model.training
    if rows is None:
        rows = torch.arange(N)
    mbs = args.micro_train_batch_size
    shared_prefix = runtime["shared_prefix"]
    key = "log_probs"  # get_response_log_probs' output this returns
    if entropy:
        key = "token_entropy"
    model.eval()
    # a sharded model (FSDP2) gathers its parameters into buffers it reuses: made under
    # inference_mode, the training forward could not write them later
    no_grad = torch.inference_mode
    if sharding.is_sharded(model):
        no_grad = torch.no_grad
    with no_grad(), hardware.autocast(device, runtime["compute_dtype"]):
        for micro, dummy in _microbatches(rows, dp, mbs):
            for idx, mb, L, P in forward_passes(tensors, micro, shared_prefix, device):
                result = losses.get_response_log_probs(
                    model,
                    **mb,
                    return_token_entropy=entropy,
                    temperature=args.temperature,
                    ban_token_ids=ban_ids,
                    prefix_len=P,
                )
                if not dummy:
                    out[idx, :L] = result[key].float().cpu()  # (rows, L)
    model.train(was_training)
    # a sharded model keeps its root's parameters gathered after a no-grad pass (FSDP2): back in
    # their shards now, so one model's root is whole at a time (a no-op unsharded)
    sharding.reshard(model)
    out = out.clone()  # a normal tensor: inference tensors cannot enter autograd later
    if dp is None:
        return out
    return dp["reduce"](out, "sum")


# ------------------------------------------------------------------------- 4. rewards -> advantages
def advantages(batch, tensors, log_probs, args):
    """The rewards -> advantages phase: the one function to edit for a reward that needs the
    policy. It runs on the learner after the no-grad passes, where the joined batch and its
    log-probs are all here: log_probs = {"policy": pi_t, "ref": pi_ref} (N, T) label log-probs,
    scored when resolve sets args.advantages_read_log_probs (else None). With grpo_ray.py's M
    learners, batch_log_probs has summed every learner's rows, so each learner computes the
    advantages one learner would.

    batch["raw"] (N,): the rewards, G consecutive rows per prompt; their advantages come from
    losses.compute_advantages. --kl-in reward takes the penalty beta x sum_t (log pi_t - log pi_ref)
    over each response's tokens (k1 per sequence) off its reward: the rewards trained on (what
    --loss no_baseline reads) and the advantages, where the penalty is centred in its group and not
    divided by the group's reward std (a group whose task rewards are all equal would otherwise
    turn its KL differences into full-size advantages). --dynamic-sampling's filter reads its own
    score, before any penalty: a flat group it kept (a step with nothing else) keeps zero
    advantages.
    -> (advantages (N,), rewards (N,) as trained on, metrics)."""
    rewards = batch["raw"]  # (N,)
    metrics = {}
    keep = None  # (n_groups,) the groups that carry advantages; None: all
    if args.dynamic_sampling:
        # a group the filter calls flat is in the batch only when a shard found nothing to learn
        # from: it may still differ in what the filter ignores (format, the length penalty), which
        # is not signal, so its advantages are zero (and it leaves --adv-std batch's std)
        keep = varied_groups(batch, args)
    adv, _ = losses.compute_advantages(
        rewards,
        args.group_size,
        args.advantage,
        args.adv_std,
        args.advantage_eps,
        args.passk_k or 1,
        keep=keep,
    )
    if args.kl_in_reward:
        mask = tensors["policy_mask"]  # (N, T) the sampled tokens, truncated rows included
        log_ratio = (log_probs["policy"] - log_probs["ref"]) * mask  # (N, T)
        penalty = args.kl_beta * log_ratio.sum(dim=1)  # (N,)
        rewards = rewards - penalty
        grouped = penalty.view(-1, args.group_size)  # (n_groups, G)
        centred = grouped - grouped.mean(dim=1, keepdim=True)  # (n_groups, G)
        if keep is not None:
            centred = centred * keep[:, None]  # a dropped group keeps zero advantages
        adv = adv - centred.reshape(-1)
        metrics["train/kl_penalty"] = penalty.mean().item()
    return adv, rewards, metrics


# ----------------------------------------------------------------------------- 5. train
def loss_settings(args):
    """The loss's hyperparameters (losses.LossSettings), one line per field, from the flags."""
    kl_beta = 0.0  # --kl-in reward: the KL is in the advantages, never in the loss
    if args.kl_in_loss:
        kl_beta = args.kl_beta
    return losses.LossSettings(
        loss=args.loss,
        cliprange=args.cliprange,
        cliprange_high=args.cliprange_high,
        length_norm=args.length_norm,
        normalize_constant=args.normalize_constant,
        kl_beta=kl_beta,
        kl_estimator=args.kl_estimator,
        entropy_coef=args.entropy_coef,
    )


def lr_factor(opt_step, args):
    """The lr multiplier of the run's optimizer step `opt_step` (0-based): sft.py's schedule, linear
    warmup over the first --warmup-frac of the steps, then cosine decay to --min-lr-frac at the last
    (1, the default: constant)."""
    total = args.n_grpo_steps * args.optimizer_steps_per_rollout_batch
    warmup = int(args.warmup_frac * total)
    if opt_step < warmup:
        return (opt_step + 1) / warmup
    progress = min(1.0, (opt_step - warmup) / max(1, total - warmup))
    return args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress))


def train_step(learner, batch, args, runtime, step, lag=0, dp=None):
    """One scored rollout batch -> (history: one dict per optimizer step, the step's metrics).

    First the no-grad passes: pi_old, and the reference and previous policies for the KL; then the
    rewards -> advantages phase (`advantages`); then _updates (epochs x train batches x
    microbatches). The policy's tokens (policy_mask: every response token but tool output) are
    what a KL measures; the tokens that carry the loss (loss_mask) leave out a truncated row's
    under --mask-truncated.
    learner: build_learner's dict. lag: how many updates the policy is ahead of the batch's
    generator (grpo_ray.py); a stale batch takes pi_old from the engine unless --rollout-is
    corrects it. The previous policy is refreshed here. dp
    (grpo_ray.py's M learners): {"rank", "world", "reduce": in-place all-reduce(tensor, op)}; each
    learner runs 1/M of every set of rows, and the gradients and metrics are summed.
    """
    t0 = time.perf_counter()
    policy = learner["policy"]
    ref_model = learner["ref_model"]
    prev_model = learner["prev_model"]
    ban_ids = batch["ban_token_ids"]
    tensors = collate(batch, args)  # and below, the per-token inputs of the loss
    metrics = {}
    sampled = tensors["policy_mask"]  # (N, T) the tokens the engine sampled: what a KL measures
    mask = tensors["loss_mask"]  # (N, T) the tokens that carry the loss
    engine_log_probs = tensors["engine_log_probs"]  # (N, T) mu, the sampling distribution
    do_kl = bool(args.kl_every) and step % args.kl_every == 0
    stale = lag > 0
    # pi_old from the engine when asked, or for a stale batch that no importance sampling corrects
    # (the engine is the only holder of that policy); else from a no-grad pass of the policy
    old_from_engine = args.old_log_probs == "engine" or (stale and args.rollout_is == "none")
    # pi_t, the policy before this step: for the KL monitor and the KL in the reward, and as the
    # trainer's pi_old
    reads = args.advantages_read_log_probs
    score_policy = do_kl or reads or (not old_from_engine and (args.needs_old or stale))
    cur = None  # (N, T) pi_t
    if score_policy:
        cur = batch_log_probs(policy, tensors, args, runtime, ban_ids, dp)
    if old_from_engine:
        tensors["old_log_probs"] = engine_log_probs
    elif cur is not None:
        tensors["old_log_probs"] = cur
    if cur is not None:
        # the engine-trainer mismatch (kernels, precision; staleness when lag > 0)
        weights, is_metrics = losses.compute_rollout_is(
            cur,
            engine_log_probs,
            mask,
            args.rollout_is,
            args.rollout_is_cap,
            args.rollout_is_level,
            args.rollout_is_floor,
        )
        for key, value in is_metrics.items():
            metrics[f"train/{key}"] = value
        metrics |= mismatch_metrics(cur, engine_log_probs, sampled, batch)
        if args.rollout_is != "none":  # else measured, not applied
            tensors["is_weights"] = weights
    ref = None  # (N, T) pi_init
    if (args.kl_in_loss or args.advantages_read_log_probs or do_kl) and ref_model is not None:
        with lora.adapters_off(ref_model):  # LoRA: the policy without its adapters
            ref = batch_log_probs(ref_model, tensors, args, runtime, ban_ids, dp)
    if args.kl_in_loss and ref is not None:
        tensors["ref_log_probs"] = ref
    if do_kl:
        kl_ref = losses.kl_divergence(cur, ref, sampled, args.kl_estimator)
        metrics["train/kl_ref"] = kl_ref.item()
        prev = None  # (N, T) pi_{t-1}
        prev_adapters = learner.get("prev_adapters")
        if prev_model is not None and getattr(prev_model, "holds_step", None) == step - 1:
            prev = batch_log_probs(prev_model, tensors, args, runtime, ban_ids, dp)
        if prev_adapters is not None and prev_adapters["step"] == step - 1:
            with lora.loaded(policy, prev_adapters["weights"]):  # LoRA: pi_{t-1}'s adapters
                prev = batch_log_probs(policy, tensors, args, runtime, ban_ids, dp)
        if prev is not None:
            kl_prev = losses.kl_divergence(cur, prev, sampled, args.kl_estimator)
            metrics["train/kl_prev"] = kl_prev.item()
            if lag == 1:
                # pi_{t-1} generated this batch: split the mismatch into kernel and staleness
                # parts, KL(mu || pi_{t-1}) and KL(pi_{t-1} || pi_t)
                kernel = losses.kl_divergence(engine_log_probs, prev, sampled, "k3")
                staleness = losses.kl_divergence(prev, cur, sampled, "k3")
                metrics["train/mismatch_kernel_kl"] = kernel.item()
                metrics["train/mismatch_staleness_kl"] = staleness.item()
    if prev_model is not None and args.kl_every and (step + 1) % args.kl_every == 0:
        prev_model.load_state_dict(policy.state_dict())  # pi_t, the next step's previous policy
        prev_model.holds_step = step
    if args.lora_rank and args.kl_every and (step + 1) % args.kl_every == 0:
        learner["prev_adapters"] = {"step": step, "weights": lora.adapter_state(policy)}
    metrics["time/old_log_probs"] = time.perf_counter() - t0
    # rewards -> advantages, now that the passes above have scored the batch
    adv, rewards, adv_metrics = advantages(batch, tensors, {"policy": cur, "ref": ref}, args)
    tensors["advantages"] = adv  # (N,)
    tensors["rewards"] = rewards  # (N,)
    metrics |= adv_metrics
    t1 = time.perf_counter()
    history = _updates(learner, batch, tensors, args, runtime, step, dp)
    metrics["time/training"] = time.perf_counter() - t1
    return history, metrics


def mismatch_metrics(cur, engine_log_probs, sampled, batch):
    """train/logprob_mismatch: the mean |log pi_t - log mu| over the sampled tokens; with --tools
    also over the rows with tool output inside and the rows without, apart: a context the trainer
    gets wrong (re-tokenised text, a trimmed id) shows on the first only."""
    gap = (cur - engine_log_probs).abs()  # (N, T)
    metrics = {"train/logprob_mismatch": losses.masked_mean(gap, sampled).item()}
    if "turns" in batch:
        multi = torch.tensor(batch["turns"]) > 1  # (N,) rows with tool output inside
        for name, rows in (("multi_turn", multi), ("single_turn", ~multi)):
            if rows.any():
                part = losses.masked_mean(gap[rows], sampled[rows])
                metrics[f"train/logprob_mismatch_{name}"] = part.item()
    return metrics


def _updates(learner, batch, tensors, args, runtime, step, dp=None):
    """The optimizer steps on one rollout batch: epochs x train batches of --train-batch-size rows
    x microbatches of --micro-train-batch-size rows. The last ones may be smaller: each forward's
    loss is scaled by its share of the optimizer step's rows. -> one metrics dict per step."""
    policy = learner["policy"]
    optimizer = learner["optimizer"]
    N = len(tensors["advantages"])
    device = runtime["policy_device"]
    shared_prefix = runtime["shared_prefix"]
    ban_ids = batch["ban_token_ids"]
    mask = tensors["loss_mask"]  # (N, T) the tokens that carry the loss
    settings = loss_settings(args)
    mbs = args.micro_train_batch_size
    gen = torch.Generator().manual_seed(sample_seed(args, step))  # off-policy shuffles
    params = [p for p in policy.parameters() if p.requires_grad]
    history = []
    for epoch in range(args.epochs_per_rollout_batch):
        if args.off_policy:
            order = torch.randperm(N, generator=gen)  # off-policy: shuffle each epoch
        elif shared_prefix:
            order = torch.arange(N)  # on-policy the order is free: keep groups whole
        else:
            order = torch.argsort(tensors["lengths"], stable=True)  # similar lengths pad less
        for b in range(0, N, args.train_batch_size):
            rows = order[b : b + args.train_batch_size]  # this optimizer step's rows
            # the step's metrics: sums over its forwards (token-weighted but the loss), and the
            # ratio's extremes
            sums = {"loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0}
            ratio_min = math.inf
            ratio_max = -math.inf
            n_tok = max(int(mask[rows].sum()), 1)  # DAPO token norm: the whole step's tokens
            keep = None  # (N, T) the tokens that carry the policy gradient; None: all
            if args.entropy_top_quantile < 1:
                keep = top_entropy_tokens(policy, tensors, rows, args, runtime, ban_ids, dp)
            for micro, dummy in _microbatches(rows, dp, mbs):
                for idx, mb, L, P in forward_passes(tensors, micro, shared_prefix, device):
                    with hardware.autocast(device, runtime["compute_dtype"]):
                        out = losses.get_response_log_probs(
                            policy,
                            **mb,
                            return_token_entropy=True,
                            temperature=args.temperature,
                            ban_token_ids=ban_ids,
                            prefix_len=P,
                        )
                    mb_mask = mask[idx, :L].to(device)  # (rows, L)
                    share = len(idx) / len(rows)  # this forward's part of the step's rows
                    mb_keep = None
                    if keep is not None:
                        mb_keep = keep[idx, :L].to(device)  # (rows, L)
                    loss, meta = losses.grpo_microbatch_loss(
                        out["log_probs"],
                        mb_mask,
                        tensors["advantages"][idx].to(device),
                        tensors["rewards"][idx].to(device),
                        settings,
                        old_log_probs=_rows(tensors, "old_log_probs", idx, L, device),
                        ref_log_probs=_rows(tensors, "ref_log_probs", idx, L, device),
                        is_weights=_rows(tensors, "is_weights", idx, L, device),
                        gradient_accumulation_steps=1 / share,
                        step_tokens=n_tok,
                        token_entropy=out["token_entropy"],
                        entropy_mask=mb_keep,
                    )
                    if dummy:
                        (loss * 0.0).backward()  # the sharded collectives pair up; nothing learnt
                        continue
                    loss.backward()
                    # token averages over the whole step, whatever the forwards' split
                    tok = float(mb_mask.sum()) / n_tok
                    entropy = losses.masked_mean(out["token_entropy"].detach(), mb_mask)
                    sums["loss"] += loss.item()
                    sums["entropy"] += entropy.nan_to_num().item() * tok
                    sums["clip_fraction"] += float(meta.get("clip_fraction", 0.0)) * tok
                    if "ratio_mean" in meta:
                        sums["ratio_mean"] += meta["ratio_mean"].nan_to_num(1.0).item() * tok
                        ratio_min = min(ratio_min, meta["ratio_min"].item())
                        ratio_max = max(ratio_max, meta["ratio_max"].item())
            if dp is not None:
                # the step's gradient and metrics: every learner's part
                ratio_min, ratio_max = _reduce(params, sums, ratio_min, ratio_max, dp)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            if dp is not None and dp.get("sharded"):
                grad_norm = grad_norm.full_tensor()  # the norm over every learner's shard
            # the seed's scheduler.step(): the lr follows the optimizer step's place in the run,
            # so a resumed run (and every grpo_ray.py learner) continues the schedule. The base lr
            # is the one the optimizer was built with, kept as torch's schedulers keep it
            opt_step = step * args.optimizer_steps_per_rollout_batch + len(history)
            factor = lr_factor(opt_step, args)
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
                group["lr"] = group["initial_lr"] * factor
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            row = history_row(sums, ratio_min, ratio_max, grad_norm.item(), epoch)
            row["train/lr"] = optimizer.param_groups[0]["lr"]
            if keep is not None:
                row["train/entropy_mask_frac"] = keep[rows].sum().item() / n_tok
            history.append(row)
    return history


def history_row(sums, ratio_min, ratio_max, grad_norm, epoch):
    """An optimizer step's history row from _updates' sums over its forwards and the ratio's
    extremes (1 when no ratio entered the loss)."""
    if ratio_min == math.inf:
        # no ratio in the loss (on-policy by construction), or no token: pi_old is pi
        sums["ratio_mean"] = 1.0
        ratio_min = 1.0
        ratio_max = 1.0
    row = {}
    for key, value in sums.items():
        row[f"train/{key}"] = value
    row["train/ratio_min"] = ratio_min
    row["train/ratio_max"] = ratio_max
    row["train/grad_norm"] = grad_norm
    row["train/epoch"] = epoch
    return row


def _rows(tensors, key, idx, L, device):
    """tensors[key]'s rows idx, cut to L columns, on device: (rows, L); None if there is no key."""
    if key not in tensors:
        return None
    return tensors[key][idx, :L].to(device)


def top_entropy_tokens(policy, tensors, rows, args, runtime, ban_ids, dp=None):
    """(N, T) bool: of the optimizer step's `rows`, the response tokens whose entropy is in the
    top --entropy-top-quantile of the step's response tokens (Wang et al. 2025 take the quantile
    over the batch). The step's microbatches run one at a time, so their entropies come from a
    no-grad pass over the step's rows first (with dp, every learner's share): one more forward
    per optimizer step, and the same tokens however the step is split into microbatches."""
    entropy = batch_log_probs(policy, tensors, args, runtime, ban_ids, dp, rows, entropy=True)
    mask = tensors["loss_mask"]  # (N, T)
    keep = torch.zeros_like(mask)  # (N, T)
    keep[rows] = losses.top_entropy_mask(entropy[rows], mask[rows], args.entropy_top_quantile)
    return keep


def _reduce(params, sums, ratio_min, ratio_max, dp):
    """All-reduce over the learners: the accumulated gradients (as one flat buffer; sharded, FSDP2's
    backward has summed them already, each learner's shard apart), the step's metric sums (in
    place), and the ratio's extremes. -> (ratio_min, ratio_max) over all."""
    if not dp.get("sharded"):
        _reduce_gradients(params, dp)
    keys = list(sums)
    values = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
    values = dp["reduce"](values, "sum").tolist()
    for key, value in zip(keys, values):
        sums[key] = value
    ratio_min = dp["reduce"](torch.tensor(ratio_min), "min").item()
    ratio_max = dp["reduce"](torch.tensor(ratio_max), "max").item()
    return ratio_min, ratio_max


def _reduce_gradients(params, dp):
    """The accumulated gradients summed over the learners, as one flat buffer."""
    grads = []
    for p in params:
        if p.grad is None:
            grads.append(torch.zeros_like(p).reshape(-1))
        else:
            grads.append(p.grad.reshape(-1))
    flat = dp["reduce"](torch.cat(grads), "sum")
    sizes = [p.numel() for p in params]
    for p, g in zip(params, flat.split(sizes)):
        p.grad = g.view_as(p).clone()


# ----------------------------------------------------------------------------- 6. log
def step_rows(step, opt_step, batch, history, metrics, step_s, weight_sync_s, wall_s):
    """One GRPO step's metric rows, one per optimizer step, for grpo.py and grpo_ray.py: metrics
    (collect's and train_step's) and the step's times, then each optimizer step's history row."""
    n_tok = sum(len(ids) for ids in batch["response_ids"])  # the step's generated tokens
    if "policy_masks" in batch:
        n_tok = sum(sum(mask) for mask in batch["policy_masks"])  # tool output is not generated
    shared = dict(metrics)
    shared["time/weight_sync"] = weight_sync_s
    shared["time/step"] = step_s
    shared["time/wall"] = wall_s
    shared["time/tokens_per_s"] = n_tok / max(step_s, 1e-9)
    shared["time/gen_tokens_per_s"] = n_tok / max(metrics["time/generation"], 1e-9)
    rows = []
    for i, h in enumerate(history):
        row = {"step": step, "opt_step": opt_step + i + 1}
        row.update(shared)
        row.update(h)
        rows.append(row)
    return rows


# The keys every step row has, in grpo.py and grpo_ray.py (which adds ray/*): metric_table.py's,
# which also says which keys depend on flags and what each means.
STEP_KEYS = metric_table.step_keys("grpo")


def step_line(step, args, row):
    """The per-step stdout line: the metrics the table puts on grpo.py's line that the row has."""
    return metric_table.step_line("grpo", f"step {step + 1}/{args.n_grpo_steps}", row)


# ----------------------------------------------------------------------------- 7. save
def save_checkpoint(learner, args, state):
    """<out>/checkpoint (runs.save_model_checkpoint's layout): the policy, its tokenizer, the
    flags, `state` and the AdamW state; with --keep-checkpoints N, the weights in the series
    checkpoints/step_NNNN too (runs.save_snapshot). -> its path."""
    optimizer = learner["optimizer"].state_dict()
    path = runs.save_model_checkpoint(
        args.out, learner["policy"], learner["tokenizer"], args, state, {"optimizer.pt": optimizer}
    )
    if args.keep_checkpoints:
        runs.save_snapshot(
            args.out, learner["policy"], learner["tokenizer"], args, state, args.keep_checkpoints
        )
    return path


# ----------------------------------------------------------------------------- 8. sync weights
def sync_weights(engine, policy, args):
    """The policy's weights into the engine (waking it first with --sleep-engine). -> seconds."""
    if args.sleep_engine:
        return engines.wake_engine(engine, policy)  # wakes it, then pushes the weights
    return engines.load_policy_into_vllm(policy, engine)


# ----------------------------------------------------------------------------- main
def stopped(message):
    """Exit after a stop request (Ctrl-C or SIGTERM) with `message` on stderr and the shell's code
    for that signal: 130 after Ctrl-C, 143 after SIGTERM."""
    print(f"\n{message}", file=sys.stderr, flush=True)
    raise SystemExit(runs.stop_exit_code())


def start_state(args):
    """The run's counters {"step", "opt_step", "wall"}: zero, or a resumed run's checkpoint's
    (runs.restore_checkpoint also cuts metrics.jsonl back to them), with its "curriculum"
    (Curriculum.state()) when it saved one."""
    state = {"step": 0, "opt_step": 0, "wall": 0.0}
    if args.resume:
        saved = runs.restore_checkpoint(args.resume, args.out)
        state = {k: v for k, v in saved.items() if k in state or k == "curriculum"}
    return state


def write_settings(args, runtime):
    """The run's flags and runtime record: <out>/args.json and <out>/runtime.json."""
    data.write_json_atomic(os.path.join(args.out, "args.json"), runs.jsonable(vars(args)))
    data.write_json_atomic(os.path.join(args.out, "runtime.json"), runs.jsonable(runtime))


def stopped_in_loop(args, state, dirty):
    """A stop request (Ctrl-C, SIGTERM) caught in the step loop: inside a step's updates (`dirty`)
    nothing consistent is there to save, so exit; else say that the steps done will be saved."""
    if dirty:
        stopped(
            f"aborted inside step {state['step']}'s updates: nothing saved; "
            f"--resume {args.out} restarts from the last checkpoint"
        )
    print(
        f"\n{runs.stop_name()}: saving checkpoint and plots (resume restarts at step "
        f"{state['step']})",
        flush=True,
    )


def finish_run(
    engine, val_rows, learner, args, n_steps, state, t_run, wandb_run, interrupted, tool=None
):
    """The end of a grpo.py or expert_iteration.py run after `n_steps` steps (or a stop request):
    the final validation (skipped after a stop), the checkpoint and the dashboard, then exit 130 or
    143 if the run was stopped. A stop request lets the save finish, unless the run is stopping
    already: then it is the second request, and the last complete checkpoint stays."""
    import plot

    if not interrupted:
        try:
            evaluate_and_dump(engine, val_rows, args, n_steps, state, t_run, None, wandb_run, tool)
        except KeyboardInterrupt:
            interrupted = True  # every step is trained: save them; a resume runs the eval
            print(f"\n{runs.stop_name()}: final eval skipped; saving checkpoint", flush=True)
    state["wall"] = time.perf_counter() - t_run
    guard = runs.finish_then_interrupt("the checkpoint save")
    if interrupted:
        guard = contextlib.nullcontext()
    path = None
    try:
        with guard:
            path = save_checkpoint(learner, args, state)
            plot.plot_runs([args.out], os.path.join(args.out, "dashboard.png"))
            if args.export_merged:
                lora.export_merged(
                    learner["policy"], learner["tokenizer"], args.export_merged, args.out
                )
    except KeyboardInterrupt:
        interrupted = True
        if path is None:
            stopped(
                f"{runs.stop_name()} again while saving: stopped; {args.out} keeps its last "
                f"complete checkpoint"
            )
    print(f"checkpoint {path} | dashboard + metrics in {args.out} | {state['wall']:.0f}s")
    if wandb_run is not None:
        wandb_run.finish()
    if interrupted:
        raise SystemExit(runs.stop_exit_code())  # 130 / 143, after everything is saved


def main(args):
    from tqdm import tqdm

    # SIGTERM (a scheduler's time limit, `timeout`, a container stop) stops the run as Ctrl-C does:
    # the step in flight finishes, the steps done are saved, exit 143
    runs.stop_on_sigterm()
    runtime = setup_runtime(args)
    if args.dry_run:
        runs.dry_run(args, runtime)  # the effective settings as one JSON line; nothing loaded
    torch.manual_seed(args.seed)
    runs.claim_run_dir(args.out, args.resume)  # an existing run needs --resume; checked writable
    engines.engine_log(os.path.join(args.out, "engine.log"))  # console: real problems only
    try:
        train_rows, val_rows = load_data(args)
        learner = build_learner(args, runtime)
        policy = learner["policy"]
        state = start_state(args)  # a resumed run's counters
        curriculum = start_curriculum(train_rows, args, state)  # --curriculum, else None
        engine = make_engine(lora.model_path(args), args, runtime, policy)
        if args.resume and args.lora_rank:
            engines.load_policy_into_vllm(policy, engine)  # the base + the checkpoint's adapter
        tool = tools.make(args)  # --tools: the tool the rollouts call, else None
    except KeyboardInterrupt:
        stopped(f"{runs.stop_name()} while loading: stopped before training; nothing saved")
    write_settings(args, runtime)  # args.json, runtime.json
    axes = {"train/*": "opt_step", "eval/*": "step"}  # eval has its own x axis
    wandb_run = runs.start_wandb(args.wandb, args, axes)
    if args.off_policy:
        policy_kind = "off-policy"
    else:
        policy_kind = "on-policy"
    print(
        f"{len(train_rows)} train / {len(val_rows)} val questions | "
        f"{args.n_prompts_per_rollout_batch} prompts x {args.group_size} samples | "
        f"{args.optimizer_steps_per_rollout_batch} optimizer steps per rollout batch "
        f"({policy_kind}) | {args.profile} profile | out {args.out}",
        flush=True,
    )
    t_run = time.perf_counter() - state["wall"]  # a resumed run's clock goes on
    sync_s = 0.0  # the last weight sync: counted in the next step's time
    dirty = False  # inside a step's updates: nothing consistent to save
    interrupted = False
    os.makedirs(os.path.join(args.out, "rollouts"), exist_ok=True)
    try:
        steps = tqdm(
            range(state["step"], args.n_grpo_steps), initial=state["step"], total=args.n_grpo_steps
        )
        for step in steps:
            t_step = time.perf_counter()
            # --- rollout + reward: G samples per question from the engine, which holds pi_step
            # (--curriculum chooses the questions); the batch's metrics ---
            picks = None  # collect's uniform draw
            if curriculum is not None:
                picks = curriculum.choose(step)
            batch, stats = collect(engine, train_rows, args, step, tool=tool, picks=picks)
            if curriculum is not None:
                curriculum.update(stats["group_outcomes"])  # every group, the dropped ones too
            metrics = summarize(batch, [stats], args)
            # --- eval: greedy on the engine's weights, the policy after `step` updates ---
            if args.eval_every and step % args.eval_every == 0:
                eval_s = evaluate_and_dump(
                    engine, val_rows, args, step, state, t_run, batch, wandb_run, tool
                )
                t_step += eval_s  # not step time
            if args.sleep_engine:
                # one shared GPU: the engine's weights and KV cache leave it while training
                engines.sleep_engine(engine)
            # --- no-grad passes, rewards -> advantages, then train (epochs x train batches x
            # microbatches); log. A first Ctrl-C lets this finish, so the saved weights, optimizer
            # and step counter agree ---
            with runs.finish_then_interrupt("this step's updates"):
                dirty = True
                history, train_metrics = train_step(learner, batch, args, runtime, step)
                rows = step_rows(
                    step,
                    state["opt_step"],
                    batch,
                    history,
                    metrics | train_metrics,
                    time.perf_counter() - t_step + sync_s,
                    sync_s,
                    time.perf_counter() - t_run,
                )
                for row in rows:
                    runs.log_row(args.out, row, wandb_run)
                    tqdm.write(step_line(step, args, row))
                state["step"] = step + 1
                state["opt_step"] = rows[-1]["opt_step"]
                state["wall"] = time.perf_counter() - t_run
                if curriculum is not None:
                    state["curriculum"] = curriculum.state()  # as of the steps trained
                dirty = False
            # --- save ---
            if args.save_every and (step + 1) % args.save_every == 0:
                save_checkpoint(learner, args, state)
            # --- sync weights into the engine for the next rollout ---
            sync_s = sync_weights(engine, policy, args)
    except KeyboardInterrupt:
        interrupted = True
        stopped_in_loop(args, state, dirty)  # exits if inside a step's updates
    # --- final eval (not after a stop request), save, exit ---
    finish_run(
        engine,
        val_rows,
        learner,
        args,
        args.n_grpo_steps,
        state,
        t_run,
        wandb_run,
        interrupted,
        tool,
    )
    if tool is not None:
        tool.close()  # the sandbox workers


if __name__ == "__main__":
    main(parse_args())
