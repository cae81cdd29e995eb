"""convert_lm.py against references written here: the assignment-1 TransformerLM as a plain torch
forward (float64) and its byte-level BPE as plain python.

A random model under the handout's state-dict names is converted; transformers must give the
reference's logits, the vLLM CPU engine its greedy tokens, and the tokenizer its ids on a few
hundred strings (unicode, whitespace runs, the special token). Head size 32 for the engine; a head
size of 16, which vLLM's CPU kernels lack, must fall back to the HF engine with a notice.
"""

import json
import math
import pickle
import random
import shlex
from collections import Counter

import pytest
import regex
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import convert_lm
import grpo
import rollout
from conftest import doc_section, requires_vllm, run_script

# the handout's pre-tokenizer pattern
PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"
# the model the logits and engine tests convert: head size 64 / 2 = 32 (vLLM's CPU kernels run it)
SIZES = dict(vocab=448, d_model=64, layers=2, heads=2, d_ff=128)
THETA = 5000.0  # not the default: the flag must reach the config
EPS = 1e-6
LOGITS_ATOL = 1e-5
WORDS = [
    "the", "cat", "sat", "on", "mat", "Once", "upon", "a", "time", "little", "girl", "named",
    "Lily", "don't", "I'll", "we're", "she's", "naïve", "café", "Ünïcödé", "中文", "字符",
    "😀", "🎉🎉", "Ελληνικά", "русский", "123", "4567", "3.14", "!!", "?", "...", "(x)", "—",
    "\u00a0", "e\u0301", "<|endof",
]  # fmt: skip
SPACES = [" ", " ", " ", "  ", "   ", "\n", "\n\n", "\t", " \n ", "\r\n", "  \t  "]


def sample_strings(n, seed):
    """n strings of words, whitespace runs and, in about a third, the special token."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            parts.append(rng.choice(WORDS))
            parts.append(rng.choice(SPACES))
            if rng.random() < 0.05:
                parts.append(EOT)
        if rng.random() < 0.3:
            parts.insert(rng.randint(0, len(parts)), EOT)
        if rng.random() < 0.5:
            parts.pop()  # half end without whitespace
        out.append("".join(parts))
    return out


# ----------------------------------------------------------------------------- reference BPE
def split_special(text):
    """Text pieces and special tokens, in order (the special token split off first)."""
    return [p for p in regex.split("(" + regex.escape(EOT) + ")", text) if p]


def train_bpe(texts, n_merges):
    """The handout's BPE training, plainly: ids 0 = EOT, 1..256 = bytes, then one per merge (the
    most frequent pair, ties to the larger pair)."""
    vocab = {0: EOT.encode()}
    for b in range(256):
        vocab[1 + b] = bytes([b])
    words = Counter()
    for text in texts:
        for piece in split_special(text):
            if piece != EOT:
                for m in regex.findall(PAT, piece):
                    words[tuple(bytes([b]) for b in m.encode())] += 1
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            for i in range(len(w) - 1):
                pairs[(w[i], w[i + 1])] += c
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        vocab[len(vocab)] = best[0] + best[1]
        merged = Counter()
        for w, c in words.items():
            merged[merge(list(w), best)] += c
        words = merged
    return vocab, merges


def merge(parts, pair):
    """Every occurrence of pair merged, left to right."""
    out = []
    i = 0
    while i < len(parts):
        if i + 1 < len(parts) and (parts[i], parts[i + 1]) == pair:
            out.append(parts[i] + parts[i + 1])
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return tuple(out)


def ref_encode(text, vocab, merges):
    """The handout's Tokenizer.encode: specials, PAT, then the lowest-rank merge until none."""
    ids = {b: i for i, b in vocab.items()}
    rank = {m: r for r, m in enumerate(merges)}
    out = []
    for piece in split_special(text):
        if piece == EOT:
            out.append(ids[EOT.encode()])
            continue
        for m in regex.findall(PAT, piece):
            parts = tuple(bytes([b]) for b in m.encode())
            while len(parts) > 1:
                candidates = []
                for i in range(len(parts) - 1):
                    if (parts[i], parts[i + 1]) in rank:
                        candidates.append(rank[(parts[i], parts[i + 1])])
                if not candidates:
                    break
                parts = merge(list(parts), merges[min(candidates)])
            for p in parts:
                out.append(ids[p])
    return out


# ----------------------------------------------------------------------------- reference model
def random_state_dict(vocab, d_model, layers, heads, d_ff, seed=0):
    """The handout's TransformerLM weights at its initialisation (nn.Linear layout (d_out, d_in),
    N(0, 2 / (d_in + d_out)) truncated at 3 sigma; embeddings N(0, 1) truncated at 3), with RMSNorm
    gains around 1 rather than at 1, so that a misplaced gain shows."""
    del heads  # not in any shape
    gen = torch.Generator().manual_seed(seed)

    def w(d_out, d_in):
        std = math.sqrt(2 / (d_in + d_out))
        t = torch.empty(d_out, d_in)
        return torch.nn.init.trunc_normal_(t, 0.0, std, -3 * std, 3 * std, generator=gen)

    def gain():
        return 1.0 + 0.1 * torch.randn(d_model, generator=gen)

    emb = torch.nn.init.trunc_normal_(torch.empty(vocab, d_model), 0, 1, -3, 3, generator=gen)
    sd = {"token_embeddings.weight": emb}
    for i in range(layers):
        for name in ("q_proj", "k_proj", "v_proj", "output_proj"):
            sd[f"layers.{i}.attn.{name}.weight"] = w(d_model, d_model)
        sd[f"layers.{i}.ln1.weight"] = gain()
        sd[f"layers.{i}.ffn.w1.weight"] = w(d_ff, d_model)
        sd[f"layers.{i}.ffn.w2.weight"] = w(d_model, d_ff)
        sd[f"layers.{i}.ffn.w3.weight"] = w(d_ff, d_model)
        sd[f"layers.{i}.ln2.weight"] = gain()
    sd["ln_final.weight"] = gain()
    sd["lm_head.weight"] = w(vocab, d_model)
    return sd


def rmsnorm(x, g, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def rope(x, theta):
    """The handout's RoPE on (B, H, T, d): adjacent pairs (x0, x1), (x2, x3), ... rotated by
    position * theta^(-2k/d)."""
    T = x.shape[2]
    d = x.shape[3]
    freq = theta ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)  # (d/2,)
    angle = torch.arange(T, dtype=x.dtype)[:, None] * freq[None, :]  # (T, d/2)
    cos = torch.cos(angle)
    sin = torch.sin(angle)
    even = x[..., 0::2]
    odd = x[..., 1::2]
    out = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)  # (B, H, T, d/2, 2)
    return out.flatten(-2)


def ref_logits(sd, ids, heads, theta=THETA, eps=EPS, dtype=torch.float64):
    """The handout's forward: (B, T) ids -> (B, T, V) logits, in float64 unless told."""
    sd = {k: v.to(dtype) for k, v in sd.items()}
    B, T = ids.shape
    x = sd["token_embeddings.weight"][ids]  # (B, T, D)
    D = x.shape[-1]
    d = D // heads
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    i = 0
    while f"layers.{i}.ln1.weight" in sd:
        p = f"layers.{i}."
        a = rmsnorm(x, sd[p + "ln1.weight"], eps)
        q = (a @ sd[p + "attn.q_proj.weight"].T).view(B, T, heads, d).transpose(1, 2)
        k = (a @ sd[p + "attn.k_proj.weight"].T).view(B, T, heads, d).transpose(1, 2)
        v = (a @ sd[p + "attn.v_proj.weight"].T).view(B, T, heads, d).transpose(1, 2)
        scores = rope(q, theta) @ rope(k, theta).transpose(-1, -2) / math.sqrt(d)  # (B, H, T, T)
        scores = scores.masked_fill(~causal, float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        x = x + attn @ sd[p + "attn.output_proj.weight"].T
        f = rmsnorm(x, sd[p + "ln2.weight"], eps)
        gate = torch.nn.functional.silu(f @ sd[p + "ffn.w1.weight"].T)
        x = x + (gate * (f @ sd[p + "ffn.w3.weight"].T)) @ sd[p + "ffn.w2.weight"].T
        i += 1
    return rmsnorm(x, sd["ln_final.weight"], eps) @ sd["lm_head.weight"].T


def ref_greedy(sd, prompt_ids, heads, max_tokens, eos):
    ids = list(prompt_ids)
    out = []
    for _ in range(max_tokens):
        nxt = int(ref_logits(sd, torch.tensor([ids]), heads)[0, -1].argmax())
        out.append(nxt)
        ids.append(nxt)
        if nxt == eos:
            break
    return out


# ----------------------------------------------------------------------------- fixtures
def write_student(d, vocab, merges, sd, wrap=True, save=True, tokenizer=True):
    """The student's files: a checkpoint (save_checkpoint's dict), GPT-2-style vocab.json +
    merges.txt and a (vocab, merges) pickle (save / tokenizer False: not the checkpoint / not the
    tokenizer files)."""
    obj = sd
    if wrap:
        obj = {"model": sd, "optimizer": {}, "iteration": 10}
    if save:
        torch.save(obj, d / "ckpt.pt")
    if not tokenizer:
        return
    to_char = convert_lm.bytes_to_unicode()

    def s(b):
        return "".join(to_char[x] for x in b)

    table = {}
    for i, b in vocab.items():
        table[s(b)] = i
    (d / "vocab.json").write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"]
    for a, b in merges:
        lines.append(f"{s(a)} {s(b)}")
    (d / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(d / "tokenizer.pkl", "wb") as f:
        pickle.dump((vocab, merges), f)


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    d = tmp_path_factory.mktemp("student")
    vocab, merges = train_bpe(sample_strings(150, seed=1), n_merges=150)
    sd = random_state_dict(**SIZES)
    write_student(d, vocab, merges, sd)
    return {"dir": d, "vocab": vocab, "merges": merges, "sd": sd}


def convert_argv(d, out, *extra):
    return [
        "--checkpoint",
        str(d / "ckpt.pt"),
        "--vocab",
        str(d / "vocab.json"),
        "--merges",
        str(d / "merges.txt"),
        "--out",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="module")
def converted(student, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted") / "lm"
    heads = str(SIZES["heads"])
    flags = ["--num-heads", heads, "--rope-theta", str(THETA), "--norm-eps", str(EPS)]
    flags += ["--context-length", "64"]
    return convert_lm.main(convert_argv(student["dir"], out, *flags))


# ----------------------------------------------------------------------------- tests
def test_byte_table_is_gpt2s():
    table = convert_lm.bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ"
    assert table[ord("\n")] == "Ċ"
    assert table[ord("a")] == "a"


def test_transformers_logits_equal_the_reference(student, converted):
    """Within 1e-5 both in float64 (the floor is HF's RoPE table, computed in float32 whatever the
    model's dtype) and both in float32, as saved (measured: 3e-7 and 1e-6, logits std 0.5)."""
    model = AutoModelForCausalLM.from_pretrained(converted)
    assert model.config.rope_parameters["rope_theta"] == THETA
    ids = torch.randint(0, SIZES["vocab"], (3, 48), generator=torch.Generator().manual_seed(0))
    want = ref_logits(student["sd"], ids, SIZES["heads"])  # float64
    with torch.no_grad():
        got32 = model(ids).logits
        got64 = model.double()(ids).logits
    want32 = ref_logits(student["sd"], ids, SIZES["heads"], dtype=torch.float32)
    diff64 = (got64 - want).abs().max().item()
    diff32 = (got32 - want32).abs().max().item()
    print(
        f"max |logit difference| vs the reference (logits std {want.std():.2f}): "
        f"{diff64:.1e} in float64, {diff32:.1e} both in float32"
    )
    assert diff64 <= LOGITS_ATOL
    assert diff32 <= LOGITS_ATOL


def test_rope_needs_the_permutation(student):
    """Without the q/k row permutation the same weights give other logits (what the test above
    would catch): the adjacent-pair and rotate-half conventions really differ."""
    from transformers import LlamaConfig, LlamaForCausalLM

    state = convert_lm.to_llama(student["sd"], SIZES["heads"], SIZES["layers"])
    for i in range(SIZES["layers"]):
        for name in ("q_proj", "k_proj"):
            raw = student["sd"][f"layers.{i}.attn.{name}.weight"]
            state[f"model.layers.{i}.self_attn.{name}.weight"] = raw
    config = LlamaConfig(
        vocab_size=SIZES["vocab"],
        hidden_size=SIZES["d_model"],
        intermediate_size=SIZES["d_ff"],
        num_hidden_layers=SIZES["layers"],
        num_attention_heads=SIZES["heads"],
        num_key_value_heads=SIZES["heads"],
        rope_theta=THETA,
        rms_norm_eps=EPS,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.load_state_dict(state)
    ids = torch.randint(0, SIZES["vocab"], (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids).logits.double()
    assert (got - ref_logits(student["sd"], ids, SIZES["heads"])).abs().max() > 100 * LOGITS_ATOL


def convert_and_compare(student, tmp_path, sd, want_sd):
    """Convert sd (the THETA/EPS flags) and -> (the notices printed, max |logit difference| of
    the result against the reference forward of want_sd, the loaded model)."""
    write_student(tmp_path, student["vocab"], student["merges"], sd)
    flags = ["--num-heads", str(SIZES["heads"]), "--rope-theta", str(THETA)]
    flags += ["--norm-eps", str(EPS), "--context-length", "64"]
    out = convert_lm.main(convert_argv(tmp_path, tmp_path / "lm", *flags))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
    ids = torch.randint(0, SIZES["vocab"], (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(ids).logits
    diff = (got - ref_logits(want_sd, ids, SIZES["heads"])).abs().max().item()
    return diff, model


def test_rope_buffers_in_the_state_dict_are_dropped_with_a_notice(student, tmp_path, capsys):
    """A student's RoPE module with persistent buffers (cos/sin tables, inv_freq) puts them in the
    state dict: they are not weights, so they are dropped with a one-line notice, not refused."""
    sd = dict(student["sd"])
    for i in range(SIZES["layers"]):
        sd[f"layers.{i}.attn.rope.cos_cached"] = torch.randn(64, 16)
        sd[f"layers.{i}.attn.rope.sin_cached"] = torch.randn(64, 16)
    sd["rope.inv_freq"] = torch.rand(16)
    diff, _ = convert_and_compare(student, tmp_path, sd, student["sd"])
    notices = [line for line in capsys.readouterr().out.splitlines() if "notice" in line]
    assert len(notices) == 1 and "dropped 5 RoPE or mask buffers" in notices[0], notices
    assert diff <= LOGITS_ATOL


def test_a_tied_model_without_lm_head_uses_the_token_embeddings(student, tmp_path, capsys):
    """No lm_head.weight: the handout's model with its output layer tied to the embeddings;
    converted with tie_word_embeddings and a notice, it gives the tied reference's logits."""
    sd = dict(student["sd"])
    del sd["lm_head.weight"]
    tied = {**sd, "lm_head.weight": sd["token_embeddings.weight"]}
    diff, model = convert_and_compare(student, tmp_path, sd, tied)
    notices = [line for line in capsys.readouterr().out.splitlines() if "notice" in line]
    assert len(notices) == 1 and "tied" in notices[0], notices
    assert model.config.tie_word_embeddings
    assert diff <= LOGITS_ATOL


def test_tokenizer_ids_equal_the_reference_bpe(student, converted, tmp_path):
    """Both serialisations give the reference's ids on 300 strings; decode inverts encode."""
    out = tmp_path / "from_pickle"
    d = student["dir"]
    argv = ["--checkpoint", str(d / "ckpt.pt"), "--tokenizer-format", "pickle"]
    argv += ["--vocab", str(d / "tokenizer.pkl"), "--num-heads", "2", "--out", str(out)]
    convert_lm.main(argv)
    from_json = AutoTokenizer.from_pretrained(converted)
    from_pickle = AutoTokenizer.from_pretrained(out)
    assert from_json.eos_token == EOT
    assert from_json.eos_token_id == 0
    texts = sample_strings(300, seed=2)
    assert sum(EOT in t for t in texts) > 50
    for text in texts:
        want = ref_encode(text, student["vocab"], student["merges"])
        assert from_json.encode(text) == want, text
        assert from_pickle.encode(text) == want, text
        assert from_json.decode(want) == text


@requires_vllm
def test_vllm_greedy_tokens_equal_the_reference(student, converted):
    kv = 16 * 2**20  # a small KV cache: a faster start
    llm = rollout.init_engine(
        "vllm", converted, seed=0, max_model_len=64, enforce_eager=True, kv_cache_memory_bytes=kv
    )
    assert not isinstance(llm, rollout.HFEngine)
    tok = AutoTokenizer.from_pretrained(converted)
    prompts = ["Once upon a time", "the cat sat on the mat", "naïve café 😀"]
    outs = rollout.generate(llm, prompts, n=1, temperature=0.0, max_tokens=12)
    distinct = set()
    for prompt, samples in zip(prompts, outs, strict=True):
        want = ref_greedy(student["sd"], tok.encode(prompt), SIZES["heads"], 12, eos=0)
        assert samples[0]["token_ids"] == want, prompt
        distinct.update(want)
    assert len(distinct) > 3  # not one repeated token


def test_a_head_size_vllm_cpu_lacks_falls_back_to_hf(tmp_path, student, capsys):
    """d_model 32 over 2 heads: head size 16, which vLLM's CPU kernels lack (they fail at the
    first request): the HF engine runs it, after a one-line notice."""
    sd = random_state_dict(vocab=448, d_model=32, layers=1, heads=2, d_ff=64)
    write_student(tmp_path, student["vocab"], student["merges"], sd, wrap=False)
    out = convert_lm.main(convert_argv(tmp_path, tmp_path / "lm", "--num-heads", "2"))
    capsys.readouterr()
    llm = rollout.init_engine("vllm", out, device="cpu", seed=0)
    notice = capsys.readouterr().out.strip().splitlines()
    assert isinstance(llm, rollout.HFEngine)
    assert len(notice) == 1
    assert "head size 16" in notice[0] and "--engine hf" in notice[0]
    samples = rollout.generate(llm, ["the cat"], n=1, temperature=0.0, max_tokens=3)
    assert len(samples[0][0]["token_ids"]) == 3
    # grpo.py's run record (runtime.json) names the engine that runs, not the flag
    argv = ["--model", out, "--engine", "vllm", "--out", str(tmp_path / "run")]
    argv += ["--group-size", "4", "--rollout-batch-size", "8", "--train-batch-size", "8"]
    argv += ["--gradient-accumulation-steps", "2"]
    args = grpo.parse_args(argv)
    runtime = grpo.setup_runtime(args)
    assert runtime["engine"] == "vllm"  # the flag, until the engine is made
    engine = grpo.make_engine(out, args, runtime)
    assert isinstance(engine, rollout.HFEngine)
    assert runtime["engine"] == "hf"


def drop_ln2(sd):
    del sd["layers.1.ln2.weight"]


def drop_ln1(sd):
    del sd["layers.1.ln1.weight"]


def bad_w2(sd):
    sd["layers.1.ffn.w2.weight"] = torch.zeros(SIZES["d_ff"], SIZES["d_model"])


def small_vocab(sd):
    sd["token_embeddings.weight"] = sd["token_embeddings.weight"][:300]
    sd["lm_head.weight"] = sd["lm_head.weight"][:300]


def extra_key(sd):
    sd["layers.0.attn.rope_scale.weight"] = torch.zeros(SIZES["d_model"], SIZES["d_model"])


def head_bias(sd):
    sd["lm_head.bias"] = torch.ones(SIZES["vocab"])


def int_weight(sd):
    sd["layers.0.ln1.weight"] = 3


def list_weight(sd):
    sd["layers.0.ln1.weight"] = [1.0] * SIZES["d_model"]


def all_nan(sd):
    for name in sd:
        sd[name] = torch.full_like(sd[name], math.nan)


def one_inf(sd):
    sd["layers.1.ffn.w2.weight"] = sd["layers.1.ffn.w2.weight"].clone()
    sd["layers.1.ffn.w2.weight"][0, 0] = math.inf


def nan_head_bias(sd):  # (an all-zero head bias is dropped: NaN must not pass for zero)
    sd["lm_head.bias"] = torch.full((SIZES["vocab"],), math.nan)


def flat_embeddings(sd):
    sd["token_embeddings.weight"] = sd["token_embeddings.weight"].flatten()


def int_tensor(sd):
    sd["layers.0.ln1.weight"] = torch.ones(SIZES["d_model"], dtype=torch.long)


BAD = [
    ("missing file", None, ["--checkpoint", "nope.pt"], "nope.pt: no such file"),
    ("heads", None, ["--num-heads", "3"], "--num-heads 3 does not split d_model 64"),
    ("missing key", drop_ln2, [], "layers.1.ln2.weight is missing"),
    ("missing ln1", drop_ln1, [], "layers.1.ln1.weight is missing"),
    ("shape", bad_w2, [], "layers.1.ffn.w2.weight has shape (128, 64), expected (64, 128)"),
    ("vocab", small_vocab, [], "token_embeddings.weight has 300 rows"),
    ("extra key", extra_key, [], "names do not say which handout weight 1 keys are"),
    ("head bias", head_bias, [], "the output layer has a bias, which a Llama has not"),
    ("int weight", int_weight, [], "layers.0.ln1.weight is not a tensor (int)"),
    ("list weight", list_weight, [], "layers.0.ln1.weight is not a tensor (list)"),
    ("all NaN", all_nan, [], "token_embeddings.weight holds 28672 non-finite values"),
    ("one inf", one_inf, [], "layers.1.ffn.w2.weight holds 1 non-finite values (NaN or inf)"),
    ("NaN head bias", nan_head_bias, [], "lm_head.bias holds 448 non-finite values"),
    ("1-D embeddings", flat_embeddings, [], "token_embeddings.weight has shape (28672,)"),
    ("int tensor", int_tensor, [], "layers.0.ln1.weight is a torch.int64 tensor"),
    ("empty special", None, ["--special-tokens", ""], "an empty token ('') names nothing"),
    ("two specials", None, ["--special-tokens", EOT, EOT], f"names {EOT!r} twice"),
    ("state key", None, ["--state-key", "weights"], "--state-key weights is not one of its keys"),
    ("no merges", None, ["--merges"], "vocab.json holds no merges: pass --merges merges.txt"),
    ("not a checkpoint", None, ["--checkpoint", "{dir}/merges.txt"], "cannot read it with torch"),
    (
        "not a pickle",
        None,
        ["--tokenizer-format", "pickle", "--vocab", "{dir}/vocab.json"],
        "not a pickle",
    ),
]


@pytest.mark.parametrize("what,mutate,flags,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line(student, tmp_path, capsys, what, mutate, flags, needle):
    sd = dict(student["sd"])
    if mutate:
        mutate(sd)
    write_student(tmp_path, student["vocab"], student["merges"], sd)
    argv = convert_argv(tmp_path, tmp_path / "lm", "--num-heads", "2")
    if flags == ["--merges"]:
        i = argv.index("--merges")
        argv = argv[:i] + argv[i + 2 :]
    else:
        for flag in flags:
            argv.append(flag.replace("{dir}", str(tmp_path)))
    with pytest.raises(SystemExit) as e:
        convert_lm.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2
    assert len(err) == 1 and err[0].startswith("error:"), err
    assert needle in err[0], err
    assert not (tmp_path / "lm").exists()


# ----------------------------------------------------------------------------- students' styles
# A student's own TransformerLM, written here in the styles students write it: their own module
# names and parameter names, a fused QKV, an einsum-style Linear storing (d_in, d_out), biases, a
# tied head, two norm epsilons. Its forward is the reference; its state_dict() is the checkpoint.
HANDOUT_SCHEME = {
    "emb": "token_embeddings", "emb_param": "weight", "blocks": "layers", "ln1": "ln1",
    "ln2": "ln2", "gain": "weight", "attn": "attn", "q": "q_proj", "k": "k_proj",
    "v": "v_proj", "o": "output_proj", "qkv": None, "ffn": "ffn", "w1": "w1", "w2": "w2",
    "w3": "w3", "final": "ln_final", "head": "lm_head", "param": "weight",
}  # fmt: skip


def put(parent, dotted, module):
    """Register module under a dotted name, making plain containers on the way."""
    *path, last = dotted.split(".")
    for name in path:
        if not hasattr(parent, name):
            parent.add_module(name, torch.nn.Module())
        parent = getattr(parent, name)
    parent.add_module(last, module)


def get(parent, dotted):
    for name in dotted.split("."):
        parent = getattr(parent, name)
    return parent


class Linear(torch.nn.Module):
    """y = x W^T (+ b), W stored (d_out, d_in), or (d_in, d_out) when transposed (y = x W)."""

    def __init__(self, d_in, d_out, param, transposed, bias, gen):
        super().__init__()
        std = math.sqrt(2 / (d_in + d_out))
        w = torch.nn.init.trunc_normal_(torch.empty(d_out, d_in), 0, std, -3 * std, 3 * std, gen)
        if transposed:
            w = w.T.contiguous()
        self.param = param
        self.transposed = transposed
        self.register_parameter(param, torch.nn.Parameter(w))
        self.bias = None
        if bias:
            self.bias = torch.nn.Parameter(0.1 * torch.randn(d_out, generator=gen))

    def forward(self, x):
        w = getattr(self, self.param)
        y = x @ w if self.transposed else x @ w.T
        if self.bias is not None:
            y = y + self.bias
        return y


class Norm(torch.nn.Module):
    def __init__(self, d, param, eps, gen):
        super().__init__()
        self.param = param
        self.eps = eps
        self.register_parameter(param, torch.nn.Parameter(1 + 0.1 * torch.randn(d, generator=gen)))

    def forward(self, x):
        return rmsnorm(x, getattr(self, self.param), self.eps)


class StudentLM(torch.nn.Module):
    """The handout's model under a naming scheme, with a student's options."""

    def __init__(self, scheme, transposed=False, attn_bias=False, ffn_bias=False, tied=False,
                 eps=EPS, final_eps=EPS, seed=0):  # fmt: skip
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        V = SIZES["vocab"]
        D = SIZES["d_model"]
        F = SIZES["d_ff"]
        self.s = {**HANDOUT_SCHEME, **scheme}
        s = self.s
        self.tied = tied
        emb = torch.nn.Module()
        table = torch.nn.init.trunc_normal_(torch.empty(V, D), 0, 1, -3, 3, generator=gen)
        emb.register_parameter(s["emb_param"], torch.nn.Parameter(table))
        put(self, s["emb"], emb)

        def lin(d_in, d_out, bias):
            return Linear(d_in, d_out, s["param"], transposed, bias, gen)

        for i in range(SIZES["layers"]):
            p = f"{s['blocks']}.{i}."
            put(self, p + s["ln1"], Norm(D, s["gain"], eps, gen))
            if s["qkv"]:
                put(self, p + f"{s['attn']}.{s['qkv']}", lin(D, 3 * D, attn_bias))
            else:
                for role in ("q", "k", "v"):
                    put(self, p + f"{s['attn']}.{s[role]}", lin(D, D, attn_bias))
            put(self, p + f"{s['attn']}.{s['o']}", lin(D, D, False))  # no o bias: zeros
            put(self, p + s["ln2"], Norm(D, s["gain"], eps, gen))
            put(self, p + f"{s['ffn']}.{s['w1']}", lin(D, F, ffn_bias))
            put(self, p + f"{s['ffn']}.{s['w2']}", lin(F, D, ffn_bias))
            put(self, p + f"{s['ffn']}.{s['w3']}", lin(D, F, ffn_bias))
        put(self, s["final"], Norm(D, s["gain"], final_eps, gen))
        if not tied:
            put(self, s["head"], lin(D, V, False))

    def forward(self, ids):
        s = self.s
        B, T = ids.shape
        table = getattr(get(self, s["emb"]), s["emb_param"])
        x = table[ids]  # (B, T, D)
        D = x.shape[-1]
        heads = SIZES["heads"]
        d = D // heads
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for i in range(SIZES["layers"]):
            p = f"{s['blocks']}.{i}."
            a = get(self, p + s["ln1"])(x)
            if s["qkv"]:
                qkv = get(self, p + f"{s['attn']}.{s['qkv']}")(a).chunk(3, dim=-1)  # [q; k; v]
            else:
                qkv = [get(self, p + f"{s['attn']}.{s[r]}")(a) for r in ("q", "k", "v")]
            qkv = [t.view(B, T, heads, d).transpose(1, 2) for t in qkv]  # (B, H, T, d) each
            q = qkv[0]
            k = qkv[1]
            v = qkv[2]
            scores = rope(q, THETA) @ rope(k, THETA).transpose(-1, -2) / math.sqrt(d)
            attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
            x = x + get(self, p + f"{s['attn']}.{s['o']}")(attn.transpose(1, 2).reshape(B, T, D))
            f = get(self, p + s["ln2"])(x)
            ffn = p + s["ffn"] + "."
            gate = torch.nn.functional.silu(get(self, ffn + s["w1"])(f))
            x = x + get(self, ffn + s["w2"])(gate * get(self, ffn + s["w3"])(f))
        x = get(self, s["final"])(x)
        if self.tied:
            return x @ table.T
        return get(self, s["head"])(x)


SCHEME_A = {
    "emb": "token_embedding", "blocks": "transformer_blocks", "ln1": "norm1", "ln2": "norm2",
    "gain": "gain", "attn": "attention", "o": "o_proj", "ffn": "feed_forward", "w1": "W1",
    "w2": "W2", "w3": "W3", "final": "final_norm",
}  # fmt: skip
SCHEME_B = {
    "emb": "embedding", "emb_param": "embedding_table", "ln1": "pre_attn_norm",
    "ln2": "pre_ffn_norm", "gain": "gi", "q": "W_q", "k": "W_k", "v": "W_v", "o": "W_o",
    "w1": "w1.linear", "w2": "w2.linear", "w3": "w3.linear", "final": "final_norm",
}  # fmt: skip
SCHEME_C = {
    "blocks": "blocks", "attn": "mha_r", "q": "w_Q", "k": "w_K", "v": "w_V", "o": "w_O",
    "ffn": "swiglu_ff", "w1": "linear_1", "w2": "linear_2", "w3": "linear_3", "param": "W",
    "gain": "g", "ln1": "rms_1", "ln2": "rms_2", "final": "rms_final",
}  # fmt: skip
SCHEME_GATE = {"attn": "self_attn", "o": "out_proj", "ffn": "mlp", "w1": "gate_proj",
               "w2": "down_proj", "w3": "up_proj", "qkv": "qkv_proj"}  # fmt: skip


def save_bare(sd, path):
    torch.save(sd, path)


def save_compiled(sd, path):  # torch.compile's prefix, in the handout's save_checkpoint dict
    state = {"_orig_mod." + k: v for k, v in sd.items()}
    torch.save({"model_state_dict": state, "optimizer_state_dict": {}, "iteration": 7}, path)


def save_ddp(sd, path):  # DDP's prefix, under model_state
    state = {"module." + k: v for k, v in sd.items()}
    torch.save({"model_state": state, "optimizer": {"state": {}}, "step": 3}, path)


# (id, StudentLM options, how it is saved, extra flags)
STYLES = [
    ("compiled, model_state_dict", {"scheme": {}}, save_compiled, []),
    ("ddp, model_state", {"scheme": {}}, save_ddp, []),
    ("names a", {"scheme": SCHEME_A}, save_bare, []),
    ("names b", {"scheme": SCHEME_B}, save_compiled, []),
    ("names c, transposed", {"scheme": SCHEME_C, "transposed": True}, save_ddp, []),
    ("gate/up/down, fused qkv", {"scheme": SCHEME_GATE}, save_bare, []),
    ("fused qkv, transposed", {"scheme": {"qkv": "qkv"}, "transposed": True}, save_bare, []),
    ("biases", {"scheme": SCHEME_A, "attn_bias": True, "ffn_bias": True}, save_bare, []),
    ("fused qkv with bias", {"scheme": {"qkv": "qkv"}, "attn_bias": True}, save_bare, []),
    ("tied", {"scheme": SCHEME_B, "tied": True}, save_bare, []),
    ("two epsilons", {"scheme": {}, "eps": 1e-5, "final_eps": 1e-6}, save_bare,
     ["--norm-eps", "1e-5", "--final-norm-eps", "1e-6"]),
]  # fmt: skip


def convert_student(student, tmp_path, model, save, extra):
    """Save a StudentLM's state dict its way, convert it, and return (its float32 logits, the
    converted model's, what convert_lm printed)."""
    save(model.state_dict(), tmp_path / "ckpt.pt")
    write_student(tmp_path, student["vocab"], student["merges"], {}, save=False)
    flags = ["--num-heads", str(SIZES["heads"]), "--rope-theta", str(THETA)]
    if "--norm-eps" not in extra:
        flags += ["--norm-eps", str(EPS)]
    out = convert_lm.main(convert_argv(tmp_path, tmp_path / "lm", *flags, *extra))
    hf = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.randint(0, SIZES["vocab"], (2, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return model(ids), hf(ids).logits, hf


@pytest.mark.parametrize("what,options,save,extra", STYLES, ids=[s[0] for s in STYLES])
def test_a_students_style_converts_to_the_same_logits(
    student, tmp_path, capsys, what, options, save, extra
):
    """Each style converts, unchanged, to the student's own forward's logits within 1e-4 (both in
    float32), and the mapping chosen is printed one line per kind of key, not per layer."""
    model = StudentLM(**options)
    want, got, hf = convert_student(student, tmp_path, model, save, extra)
    printed = capsys.readouterr().out
    diff = (got - want).abs().max().item()
    print(f"{what}: max |logit difference| {diff:.1e}")
    assert diff < 1e-4, what
    names = [line for line in printed.splitlines() if line.startswith("names:")]
    assert not any(".1." in line for line in names), names  # {i}, not each layer
    if options["scheme"] not in ({}, {"qkv": "qkv"}):
        assert names
    if save is not save_bare:
        assert "checkpoint: weights from its 'model_" in printed
    assert hf.config.attention_bias == options.get("attn_bias", False)
    assert hf.config.mlp_bias == options.get("ffn_bias", False)
    assert hf.config.tie_word_embeddings == options.get("tied", False)


def test_a_key_map_names_what_hints_cannot(student, tmp_path, capsys):
    """Names without hints are refused listing them; --key-map's regexes (with groups) decide."""
    scheme = {"blocks": "h", "attn": "mix", "q": "a", "k": "b", "v": "c", "o": "d"}
    model = StudentLM(scheme)
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    write_student(tmp_path, student["vocab"], student["merges"], {}, save=False)
    argv = convert_argv(tmp_path, tmp_path / "lm", "--num-heads", "2")
    with pytest.raises(SystemExit):
        convert_lm.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "h.0.mix.a.weight" in err[0] and "--key-map" in err[0], err
    key_map = {r"h\.(\d+)\.mix\.a\.weight": r"layers.\1.attn.q_proj.weight",
               r"h\.(\d+)\.mix\.b\.weight": r"layers.\1.attn.k_proj.weight",
               r"h\.(\d+)\.mix\.c\.weight": r"layers.\1.attn.v_proj.weight",
               r"h\.(\d+)\.mix\.d\.weight": r"layers.\1.attn.output_proj.weight"}  # fmt: skip
    (tmp_path / "names.json").write_text(json.dumps(key_map))
    extra = ["--rope-theta", str(THETA), "--norm-eps", str(EPS)]
    argv += ["--key-map", str(tmp_path / "names.json"), *extra]
    out = convert_lm.main(argv)
    printed = capsys.readouterr().out
    assert "names: h.{i}.mix.a.weight -> layers.{i}.attn.q_proj.weight" in printed
    ids = torch.randint(0, SIZES["vocab"], (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (AutoModelForCausalLM.from_pretrained(out)(ids).logits - model(ids)).abs().max()
    assert diff < 1e-4


def namespace_checkpoint(model, path):
    import argparse

    torch.save({"model": model.state_dict(), "args": argparse.Namespace(lr=1e-3)}, path)


def refusal(argv, capsys):
    with pytest.raises(SystemExit) as e:
        convert_lm.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


def test_a_namespace_in_the_checkpoint_needs_trust(student, tmp_path, capsys):
    """weights_only refuses a pickled Namespace: one line saying how to re-save; with
    --trust-checkpoint it loads, after a one-line warning."""
    model = StudentLM({})
    namespace_checkpoint(model, tmp_path / "ckpt.pt")
    write_student(tmp_path, student["vocab"], student["merges"], {}, save=False)
    argv = convert_argv(tmp_path, tmp_path / "lm", "--num-heads", "2")
    err = refusal(argv, capsys)
    assert "torch.save(model.state_dict()" in err and "--trust-checkpoint" in err
    convert_lm.main(argv + ["--trust-checkpoint"])
    warnings = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning")]
    assert len(warnings) == 1 and "runs any code" in warnings[0]


def test_what_cannot_convert_is_one_line(student, tmp_path, capsys):
    """Two epsilons far apart, square shapes that cannot show the orientation, two state dicts:
    each one line naming the flag."""
    write_student(tmp_path, student["vocab"], student["merges"], {}, save=False)
    model = StudentLM({})
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    argv = convert_argv(tmp_path, tmp_path / "lm", "--num-heads", "2")
    err = refusal(argv + ["--final-norm-eps", "10"], capsys)
    assert "--final-norm-eps 10.0" in err and "over 0.0001" in err
    sd = {k: v for k, v in model.state_dict().items() if not k.startswith("lm_head")}
    for name in list(sd):  # d_ff = d_model, tied: every Linear square
        if ".ffn.w" in name:
            sd[name] = torch.randn(SIZES["d_model"], SIZES["d_model"])
    torch.save(sd, tmp_path / "ckpt.pt")
    assert "pass --no-transposed" in refusal(argv, capsys)
    torch.save({"model": sd, "ema": sd}, tmp_path / "ckpt.pt")
    assert "pass --state-key NAME" in refusal(argv, capsys)
    convert_lm.main(argv + ["--state-key", "ema", "--no-transposed"])


# ----------------------------------------------------------------------------- tokenizer files
def hexs(b):
    return b.hex()


def latin1(b):
    return b.decode("latin-1")


def reprs(b):
    return repr(b)


def ints(b):
    return list(b)


def gpt2s(b):
    to_char = convert_lm.bytes_to_unicode()
    return "".join(to_char[x] for x in b)


# (id, how a vocab entry is written, orientation, how merges are written, the form reported)
TOKENIZER_FORMS = [
    ("ids to int lists, repr merges", ints, "id", "repr", "byte values"),
    ("str ids to GPT-2 strings, text merges", gpt2s, "id", "text", "GPT-2 byte-to-unicode"),
    ("str ids to latin-1, JSON merges", latin1, "id", "json", "latin-1 strings"),
    ("ids to hex, text merges", hexs, "id", "text", "hex strings"),
    ("ids to bytes reprs, repr merges", reprs, "id", "repr", "bytes reprs"),
    ("latin-1 token to id, repr merges", latin1, "token", "repr", "latin-1 strings"),
]


def write_json_tokenizer(d, vocab, merges, spell, orientation, merges_as):
    table = {}
    for i, b in vocab.items():
        if orientation == "id":
            table[str(i)] = spell(b)
        else:
            table[spell(b)] = i
    (d / "vocab.json").write_text(json.dumps(table), encoding="utf-8")
    if merges_as == "json":
        text = json.dumps([[spell(a), spell(b)] for a, b in merges])
    elif merges_as == "repr":
        text = "\n".join(f"{a!r} {b!r}" for a, b in merges)
    else:
        text = "\n".join(f"{spell(a)} {spell(b)}" for a, b in merges)
    (d / "merges.txt").write_text(text + "\n", encoding="utf-8")


@pytest.mark.parametrize(
    "what,spell,orientation,merges_as,form", TOKENIZER_FORMS, ids=[f[0] for f in TOKENIZER_FORMS]
)
def test_json_tokenizers_students_write_read_as_their_bpe(
    student, tmp_path, capsys, what, spell, orientation, merges_as, form
):
    """auto reads each form, says which it found, and gives the reference BPE's ids."""
    write_json_tokenizer(
        tmp_path, student["vocab"], student["merges"], spell, orientation, merges_as
    )
    vocab, merges = convert_lm.read_tokenizer(
        "auto", str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"), [EOT]
    )
    assert f"with {form}" in capsys.readouterr().out
    assert vocab == student["vocab"] and merges == student["merges"]
    tok = convert_lm.build_tokenizer(vocab, merges, [EOT], 64)
    for text in sample_strings(60, seed=4):
        assert tok.encode(text) == ref_encode(text, student["vocab"], student["merges"]), text


def test_a_lossy_json_vocabulary_is_one_line(student, tmp_path, capsys):
    """Tokens saved with bytes.decode(errors="replace") lost their bytes: refused, naming why."""
    spell = lambda b: b.decode("utf-8", errors="replace")  # noqa: E731
    write_json_tokenizer(tmp_path, student["vocab"], student["merges"], spell, "id", "text")
    write_student(tmp_path, student["vocab"], student["merges"], student["sd"], tokenizer=False)
    err = refusal(convert_argv(tmp_path, tmp_path / "lm", "--num-heads", "2"), capsys)
    assert "U+FFFD" in err


def pairs_vocab(d, vocab, merges):  # [[token, id], ...]: a list, but not of tokens
    table = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
    (d / "vocab.json").write_text(json.dumps(sorted(table.items(), key=lambda kv: kv[1])))


def negative_ids(d, vocab, merges):
    table = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
    (d / "vocab.json").write_text(json.dumps({t: i - 1 for t, i in table.items()}))


def string_merges(d, vocab, merges):  # merges.txt's text saved as one JSON string
    (d / "merges.txt").write_text(json.dumps((d / "merges.txt").read_text(encoding="utf-8")))


def int_merges(d, vocab, merges):
    (d / "merges.txt").write_text(json.dumps([[1, 2]]))


def binary_merges(d, vocab, merges):
    (d / "merges.txt").write_bytes(b"\xff\xfe a b\n")


def pickled_string_merges(d, vocab, merges):
    with open(d / "tokenizer.pkl", "wb") as f:
        pickle.dump((vocab, "a b\nc d"), f)


BAD_TOKENIZERS = [
    ("list of pairs", pairs_vocab, "entry 0 of the vocabulary list is \"['<|endoftext|>', 0]\""),
    ("negative ids", negative_ids, "has id -1; ids count from 0"),
    ("string merges", string_merges, "merges.txt: a JSON str, expected a list of [a, b] pairs"),
    ("int merges", int_merges, "merges.txt: merge 0: a int, not a token"),
    ("binary merges", binary_merges, "merges.txt: not UTF-8 text"),
    ("pickled string", pickled_string_merges, "tokenizer.pkl: merges are a str, expected a list"),
]


@pytest.mark.parametrize("what,spoil,needle", BAD_TOKENIZERS, ids=[b[0] for b in BAD_TOKENIZERS])
def test_a_tokenizer_file_of_the_wrong_shape_is_one_line(
    student, tmp_path, capsys, what, spoil, needle
):
    write_student(tmp_path, student["vocab"], student["merges"], student["sd"])
    spoil(tmp_path, student["vocab"], student["merges"])
    argv = convert_argv(tmp_path, tmp_path / "lm", "--num-heads", "2")
    if spoil is pickled_string_merges:
        argv = [
            "--checkpoint",
            str(tmp_path / "ckpt.pt"),
            "--vocab",
            str(tmp_path / "tokenizer.pkl"),
        ]
        argv += ["--out", str(tmp_path / "lm"), "--num-heads", "2"]
    assert needle in refusal(argv, capsys)
    assert not (tmp_path / "lm").exists()


def test_token_ids_past_the_embeddings_are_one_line(student, tmp_path, capsys):
    """A vocabulary whose ids run past token_embeddings' rows converted before without a word."""
    write_student(tmp_path, student["vocab"], student["merges"], student["sd"])
    table = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    (tmp_path / "vocab.json").write_text(json.dumps({t: i * 10 for t, i in table.items()}))
    err = refusal(convert_argv(tmp_path, tmp_path / "lm", "--num-heads", "2"), capsys)
    assert "the tokenizer has id 4060 but token_embeddings.weight has 448 rows" in err


class Payload:
    """A pickle whose loading would write a file (what a hostile tokenizer.pkl could do)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_tokenizer_pickle_runs_no_code(student, tmp_path, capsys):
    marker = tmp_path / "ran"
    with open(tmp_path / "tokenizer.pkl", "wb") as f:
        pickle.dump((student["vocab"], student["merges"], Payload(str(marker))), f)
    write_student(tmp_path, student["vocab"], student["merges"], student["sd"], tokenizer=False)
    argv = ["--checkpoint", str(tmp_path / "ckpt.pt"), "--vocab", str(tmp_path / "tokenizer.pkl")]
    argv += ["--tokenizer-format", "pickle", "--out", str(tmp_path / "lm")]
    err = refusal(argv, capsys)
    assert "pickles io.open, not plain data" in err
    assert not marker.exists()


# ----------------------------------------------------------------------------- the workflow
GRPO_ONE_STEP = (
    "--n-grpo-steps 1 --rollout-batch-size 4 --group-size 2 --train-batch-size 4 "
    "--gradient-accumulation-steps 2 --max-tokens 12 --eval-n 2 --eval-every 0 "
    "--grader-workers 0 --eager --engine hf"
).split()


def test_the_readmes_seed_004_workflow_runs(student, tmp_path):
    """The README's two commands as written, in a directory holding the student's files: convert,
    then one GRPO step of the keyword task on the converted model."""
    block = doc_section("Your own assignment-1 model (seed 004)").split("```bash")[1]
    commands = [shlex.split(line) for line in block.split("```")[0].strip().splitlines()]
    assert [c[:2] for c in commands] == [["python", "convert_lm.py"], ["python", "grpo.py"]]
    write_student(tmp_path, student["vocab"], student["merges"], student["sd"])
    # about 10% of the words hash to the validation split
    words = ["apple", "river", "cat"] + [str(i) for i in range(100)]
    (tmp_path / "keywords.txt").write_text("\n".join(words) + "\n")
    proc = run_script(commands[0][1:], str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    grpo_argv = commands[1][1:]
    proc = run_script(grpo_argv + GRPO_ONE_STEP, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / grpo_argv[grpo_argv.index("--out") + 1]
    saved = json.loads((run / "args.json").read_text())
    assert saved["task"] == "keyword" and saved["model"] == "models/my-lm"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in m for m in metrics)


def test_review_cases_are_kept_or_one_line(tmp_path):
    """A bias under a module whose name holds "mask" or "sin" is a weight, not a RoPE/mask buffer
    (it was dropped, converting to a model without biases); a malformed pickle and a --key-map
    template naming a group its pattern lacks are ValueErrors (one line), not tracebacks."""
    import re

    state = {
        "layers.0.masked_attn.wq.bias": torch.zeros(4),
        "processing.w1.weight": torch.zeros(4, 4),
        "layers.0.attn.rope.cos_cached": torch.zeros(8, 2),
        "rotary_emb.inv_freq": torch.zeros(2),
        "layers.0.attn.causal_mask": torch.ones(4, 4, dtype=torch.bool),
    }
    kept = convert_lm.drop_buffers(state)
    assert sorted(kept) == ["layers.0.masked_attn.wq.bias", "processing.w1.weight"]
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(b"\x80\x02}}b.")
    with pytest.raises(ValueError, match="not a pickle of plain data"):
        convert_lm.read_one_pickle(str(bad))
    key_map = [(re.compile(r"emb\.(w)"), r"token_embeddings.\2")]
    with pytest.raises(ValueError, match="--key-map"):
        convert_lm.map_names({"emb.w": torch.zeros(2, 2)}, key_map)
