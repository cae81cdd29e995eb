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
from collections import Counter

import pytest
import regex
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import convert_lm
import grpo
import rollout
from conftest import requires_vllm

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
def write_student(d, vocab, merges, sd, wrap=True):
    """The student's files: a checkpoint (save_checkpoint's dict), GPT-2-style vocab.json +
    merges.txt and a (vocab, merges) pickle."""
    obj = sd
    if wrap:
        obj = {"model": sd, "optimizer": {}, "iteration": 10}
    torch.save(obj, d / "ckpt.pt")
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
    assert len(notices) == 1 and "dropped 5 RoPE buffers" in notices[0], notices
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
    sd["layers.0.attn.q_proj.bias"] = torch.zeros(SIZES["d_model"])


BAD = [
    ("missing file", None, ["--checkpoint", "nope.pt"], "nope.pt: no such file"),
    ("heads", None, ["--num-heads", "3"], "--num-heads 3 does not split d_model 64"),
    ("missing key", drop_ln2, [], "layers.1.ln2.weight is missing"),
    ("missing ln1", drop_ln1, [], "layers.1.ln1.weight is missing"),
    ("shape", bad_w2, [], "layers.1.ffn.w2.weight has shape (128, 64), expected (64, 128)"),
    ("vocab", small_vocab, [], "token_embeddings.weight has 300 rows"),
    ("extra key", extra_key, [], "layers.0.attn.q_proj.bias is not a TransformerLM weight"),
    ("no merges", None, ["--merges"], "--tokenizer-format gpt2 needs --merges"),
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
