"""Convert your CS336 assignment-1 TransformerLM (seed 004's "your HW1/HW2 model") into a Hugging
Face Llama directory with a fast tokenizer, which every script here takes as --model.

The handout's model is a pre-norm decoder with RMSNorm, SwiGLU and RoPE, no biases, an untied output
layer: a Llama. The checkpoint (a bare state dict, or the handout's save_checkpoint dict holding it
under "model") has the handout's names (token_embeddings.weight, layers.{i}.attn.q_proj.weight, ...,
ln_final.weight, lm_head.weight) and no hyperparameters: vocabulary, width, depth and d_ff are read
off the weight shapes, the rest are flags with the handout's defaults. The shapes check only
that --num-heads gives even head sizes: compare a logit of the result with your own forward.
The tokenizer is the student's byte-level BPE, in either of the usual serialisations
(--tokenizer-format): GPT-2's vocab.json + merges.txt, or a pickle of the (vocab: id -> bytes,
merges: list of byte pairs) the handout's Tokenizer takes. It becomes a `tokenizers` BPE with
GPT-2's pre-tokenizer (the handout's PAT), and the special tokens keep their ids.

How the result departs from the handout's model, and why it is still the same function:
- RoPE: the handout rotates adjacent pairs (x0, x1), (x2, x3), ... of each head; HF Llama rotates
  halves (x_i, x_{i + d/2}). Pair i has the same frequency theta^(-2i/d) in both, so reordering each
  head's q_proj and k_proj rows as [0, 2, 4, ..., 1, 3, 5, ...] gives the same rotated q.k scores
  (q and k are permuted alike; v and the output projection are not touched).
- SwiGLU: W2(SiLU(W1 x) * W3 x) is Llama's down(SiLU(gate x) * up x): w1 -> gate, w3 -> up,
  w2 -> down.
- The tokenizer adds no BOS (the handout's model never saw one); the first special token is EOS and
  pad. torch.compile's "_orig_mod." and DDP's "module." name prefixes are dropped, and so are RoPE
  buffers a student registered as persistent (cos/sin tables, inv_freq), with a notice. Without
  lm_head.weight the model is taken as tied (tie_word_embeddings), with a notice.
- Saved in float32. A head size vLLM's CPU engine cannot run is fine: the scripts fall back to
  --engine hf with a notice (rollout.init_engine).

Examples:
  python convert_lm.py --checkpoint ckpt.pt --vocab vocab.json --merges merges.txt \\
      --out models/my-lm
  python convert_lm.py --checkpoint ckpt.pt --tokenizer-format pickle --vocab tokenizer.pkl \\
      --num-heads 16 --rope-theta 10000 --context-length 256 --out models/my-lm
  python grpo.py --model models/my-lm --task keyword --train-path keywords.txt \\
      --val-path keywords.txt
"""

import json
import os
import pickle

import torch

from common import Parser, attempt, check, existing_file, positive_float, positive_int

# the handout's pre-tokenizer: GPT-2's split, applied between special tokens
PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# handout name (after layers.{i}.) -> HF Llama name (after model.layers.{i}.)
LAYER_NAMES = {
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.output_proj.weight": "self_attn.o_proj.weight",
    "ln1.weight": "input_layernorm.weight",
    "ln2.weight": "post_attention_layernorm.weight",
    "ffn.w1.weight": "mlp.gate_proj.weight",
    "ffn.w3.weight": "mlp.up_proj.weight",
    "ffn.w2.weight": "mlp.down_proj.weight",
}


# ----------------------------------------------------------------------------- config
def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("input")
    g.add_argument(
        "--checkpoint", required=True, type=existing_file, help="torch.save'd state dict"
    )
    g.add_argument(
        "--tokenizer-format",
        default="gpt2",
        choices=["gpt2", "pickle"],
        help="gpt2: --vocab vocab.json --merges merges.txt (GPT-2's byte-to-unicode strings); "
        "pickle: --vocab FILE holding (vocab, merges) or {'vocab', 'merges'}, or --vocab and "
        "--merges as two pickles (vocab: id -> bytes, merges: [(bytes, bytes)])",
    )
    g.add_argument("--vocab", required=True, type=existing_file, help="vocab.json or a pickle")
    g.add_argument("--merges", type=existing_file, help="merges.txt, or the merges pickle")
    g.add_argument(
        "--special-tokens",
        nargs="+",
        default=["<|endoftext|>"],
        help="the special tokens you trained with; the first is EOS",
    )
    g = p.add_argument_group("architecture (not in the checkpoint; the handout's defaults)")
    g.add_argument("--num-heads", type=positive_int, default=16, help="attention heads")
    g.add_argument("--rope-theta", type=positive_float, default=10000.0, help="RoPE's Theta")
    g.add_argument("--context-length", type=positive_int, default=256, help="max positions")
    g.add_argument("--norm-eps", type=positive_float, default=1e-5, help="RMSNorm's epsilon")
    g = p.add_argument_group("output")
    g.add_argument("--out", required=True, help="a new (or empty) directory for the HF model")
    return resolve(p.parse_args(argv))


def resolve(args):
    """Checks that need no loading: the file pair the format needs, a usable --out."""
    if args.tokenizer_format == "gpt2":
        check(args.merges is not None, "--tokenizer-format gpt2 needs --merges merges.txt")
    check(
        not os.path.isfile(args.out) and not (os.path.isdir(args.out) and os.listdir(args.out)),
        f"--out {args.out} exists and is not an empty directory: pick a new one",
    )
    return args


# ----------------------------------------------------------------------------- tokenizer
def bytes_to_unicode():
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the
    other 68 map to chr(256), chr(257), ... in byte order. vocab.json and merges.txt use it."""
    keep = list(range(ord("!"), ord("~") + 1))
    keep += list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    table = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_gpt2(vocab_path, merges_path, special_tokens):
    """(vocab {id: bytes}, merges [(bytes, bytes)]) from GPT-2-style files."""
    decode = {c: b for b, c in bytes_to_unicode().items()}

    def as_bytes(s, where):
        if s in special_tokens:
            return s.encode("utf-8")
        for c in s:
            if c not in decode:
                raise ValueError(f"{where}: {s!r} is not in GPT-2's byte-to-unicode alphabet")
        return bytes(decode[c] for c in s)

    with open(vocab_path, encoding="utf-8") as f:
        try:
            table = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{vocab_path}: not JSON ({e})") from None
    if not isinstance(table, dict):
        raise ValueError(f"{vocab_path}: expected a JSON object {{token: id}}")
    vocab = {}
    for s, i in table.items():
        vocab[int(i)] = as_bytes(s, vocab_path)
    merges = []
    with open(merges_path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or (n == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ValueError(f"{merges_path}:{n}: expected two tokens separated by a space")
            where = f"{merges_path}:{n}"
            merges.append((as_bytes(parts[0], where), as_bytes(parts[1], where)))
    return vocab, merges


def read_pickle(vocab_path, merges_path):
    """(vocab, merges) from one pickle of both (a tuple or a dict), or from two pickles."""
    obj = read_one_pickle(vocab_path)
    if merges_path is not None:
        return obj, read_one_pickle(merges_path)
    if isinstance(obj, dict) and "vocab" in obj and "merges" in obj:
        return obj["vocab"], obj["merges"]
    if isinstance(obj, (tuple, list)) and len(obj) == 2:
        return obj[0], obj[1]
    raise ValueError(
        f"{vocab_path}: expected (vocab, merges) or {{'vocab', 'merges'}}; "
        f"for a vocab-only pickle pass --merges too"
    )


def read_one_pickle(path):
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError) as e:
        raise ValueError(f"{path}: not a pickle this python can read ({e})") from None


def build_tokenizer(vocab, merges, special_tokens, context_length):
    """A transformers fast tokenizer that encodes as the handout's Tokenizer(vocab, merges,
    special_tokens) does: specials split off first, then PAT, then BPE by merge rank. A special
    token missing from vocab gets the next id, as the handout's tokenizer appends it."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    to_char = bytes_to_unicode()
    specials = {s.encode("utf-8"): s for s in special_tokens}
    table = {}  # BPE vocabulary: GPT-2 strings -> id; a special token as its own text
    for i, b in vocab.items():
        if not isinstance(b, bytes):
            raise ValueError(f"vocab id {i}: expected bytes, got {type(b).__name__}")
        s = specials.get(b) or "".join(to_char[x] for x in b)
        if s in table:
            raise ValueError(f"vocab ids {table[s]} and {i} are both {b!r}")
        table[s] = int(i)
    for s in special_tokens:
        if s not in table:
            table[s] = max(table.values()) + 1
    for b in range(256):
        if to_char[b] not in table:
            raise ValueError(f"vocab has no single-byte token for byte {b}: not a byte-level BPE")
    pairs = []
    for n, (a, b) in enumerate(merges):
        pair = ("".join(to_char[x] for x in a), "".join(to_char[x] for x in b))
        for s in (pair[0], pair[1], pair[0] + pair[1]):
            if s not in table:
                raise ValueError(f"merge {n} {(a, b)!r}: {s!r} is not in the vocabulary")
        pairs.append(pair)
    tok = Tokenizer(models.BPE(vocab=table, merges=pairs, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PAT), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added = []
    for s in special_tokens:
        added.append(AddedToken(s, special=True, normalized=False))
    tok.add_special_tokens(added)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=special_tokens[0],
        pad_token=special_tokens[0],
        model_max_length=context_length,
    )


# ----------------------------------------------------------------------------- weights
def load_state_dict(path):
    """The checkpoint's weights: a bare state dict, or save_checkpoint's {"model": ...}."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a pickle error or a foreign file: name the file and the cause
        cause = str(e).strip().splitlines()[0]  # torch's own advice runs to many lines
        raise ValueError(f"cannot read it with torch.load ({type(e).__name__}: {cause})") from None
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or "token_embeddings.weight" not in obj:
        raise ValueError("no token_embeddings.weight: expected the handout's state dict")
    state = {}
    for name, t in obj.items():
        name = name.removeprefix("module.").removeprefix("_orig_mod.")
        state[name] = t
    return state


def drop_rope_buffers(state):
    """The state dict without RoPE's persistent buffers (a cos/sin table or inv_freq a student
    registered, e.g. layers.0.attn.rope.cos_cached): float tensors, not .weight, named after RoPE.
    The converted model computes its own from --rope-theta; a one-line notice names them."""
    dropped = []
    for name, t in state.items():
        last = name.split(".")[-1]
        named_rope = any(word in name for word in ("rope", "rotary", "cos", "sin", "inv_freq"))
        if named_rope and last != "weight" and torch.is_tensor(t) and t.is_floating_point():
            dropped.append(name)
    if dropped:
        print(
            f"notice: dropped {len(dropped)} RoPE buffers ({dropped[0]}, ...): not weights; "
            f"the converted model builds its own from --rope-theta",
            flush=True,
        )
    kept = {}
    for name, t in state.items():
        if name not in dropped:
            kept[name] = t
    return kept


def check_shapes(state, num_heads):
    """The sizes the shapes imply {vocab, d_model, layers, d_ff}; ValueError naming the first key
    that is missing, extra or misshapen, or the flag that does not fit."""
    V, D = state["token_embeddings.weight"].shape
    L = 0  # one more than the highest layer index any name has
    for name in state:
        parts = name.split(".")
        if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit():
            L = max(L, int(parts[1]) + 1)
    if "layers.0.ffn.w1.weight" not in state:
        raise ValueError("no layers.0.ffn.w1.weight: expected the handout's state dict")
    F = state["layers.0.ffn.w1.weight"].shape[0]
    if D % num_heads != 0 or (D // num_heads) % 2 != 0:
        raise ValueError(
            f"--num-heads {num_heads} does not split d_model {D} into even head sizes: "
            f"pass the --num-heads you trained with"
        )
    want = {"token_embeddings.weight": (V, D), "ln_final.weight": (D,)}
    if "lm_head.weight" in state:  # else tied: the output layer is token_embeddings
        want["lm_head.weight"] = (V, D)
    shapes = {
        "attn.q_proj.weight": (D, D),
        "attn.k_proj.weight": (D, D),
        "attn.v_proj.weight": (D, D),
        "attn.output_proj.weight": (D, D),
        "ln1.weight": (D,),
        "ln2.weight": (D,),
        "ffn.w1.weight": (F, D),
        "ffn.w3.weight": (F, D),
        "ffn.w2.weight": (D, F),
    }
    for i in range(L):
        for name, shape in shapes.items():
            want[f"layers.{i}.{name}"] = shape
    for name, shape in want.items():
        if name not in state:
            raise ValueError(f"{name} is missing (expected shape {shape})")
        if tuple(state[name].shape) != shape:
            raise ValueError(
                f"{name} has shape {tuple(state[name].shape)}, expected {shape} "
                f"(d_model {D}, d_ff {F}, vocab {V})"
            )
    extra = sorted(set(state) - set(want))
    if extra:
        raise ValueError(f"{extra[0]} is not a TransformerLM weight ({len(extra)} unexpected)")
    return {"vocab": V, "d_model": D, "layers": L, "d_ff": F, "tied": "lm_head.weight" not in state}


def rope_halves(w, num_heads):
    """q_proj / k_proj rows reordered from adjacent-pair RoPE to HF's rotate-half: per head,
    the even rows then the odd ones."""
    d_out, d_in = w.shape
    head = d_out // num_heads
    w = w.view(num_heads, head // 2, 2, d_in)  # (H, head/2, pair, d_in)
    return w.transpose(1, 2).reshape(d_out, d_in)  # (H, pair, head/2, d_in) -> rows


def to_llama(state, num_heads, layers):
    """The handout's state dict under HF Llama's names, q/k rows in rotate-half order, fp32. No
    lm_head.weight (a tied model): the token embeddings are the output layer."""
    out = {
        "model.embed_tokens.weight": state["token_embeddings.weight"],
        "model.norm.weight": state["ln_final.weight"],
        "lm_head.weight": state.get("lm_head.weight", state["token_embeddings.weight"]),
    }
    for i in range(layers):
        for name, hf_name in LAYER_NAMES.items():
            w = state[f"layers.{i}.{name}"]
            if name in ("attn.q_proj.weight", "attn.k_proj.weight"):
                w = rope_halves(w, num_heads)
            out[f"model.layers.{i}.{hf_name}"] = w
    for name, w in out.items():
        out[name] = w.detach().to(torch.float32).contiguous()
    return out


# ----------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.tokenizer_format == "gpt2":
        vocab, merges = attempt(read_gpt2, args.vocab, args.merges, args.special_tokens)
    else:
        vocab, merges = attempt(read_pickle, args.vocab, args.merges, what="--vocab")
    tokenizer = attempt(
        build_tokenizer, vocab, merges, args.special_tokens, args.context_length, what="tokenizer"
    )
    state = attempt(load_state_dict, args.checkpoint, what=f"--checkpoint {args.checkpoint}")
    state = drop_rope_buffers(state)
    sizes = attempt(check_shapes, state, args.num_heads, what=f"--checkpoint {args.checkpoint}")
    if sizes["tied"]:
        print(
            "notice: no lm_head.weight: a tied model, so the output layer is "
            "token_embeddings.weight (tie_word_embeddings)",
            flush=True,
        )
    check(
        len(tokenizer) <= sizes["vocab"],
        f"the tokenizer has {len(tokenizer)} tokens but token_embeddings.weight has "
        f"{sizes['vocab']} rows: pass the tokenizer files (and --special-tokens) you trained with",
    )
    eos = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=sizes["vocab"],
        hidden_size=sizes["d_model"],
        intermediate_size=sizes["d_ff"],
        num_hidden_layers=sizes["layers"],
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_heads,
        head_dim=sizes["d_model"] // args.num_heads,
        max_position_embeddings=args.context_length,
        rms_norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=sizes["tied"],
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.load_state_dict(to_llama(state, args.num_heads, sizes["layers"]), strict=True)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    with open(os.path.join(args.out, "convert_args.json"), "w") as f:
        json.dump(vars(args), f, indent=1)
    print(
        f"converted {args.checkpoint}: vocab {sizes['vocab']}, d_model {sizes['d_model']}, "
        f"{sizes['layers']} layers, {args.num_heads} heads (head size "
        f"{sizes['d_model'] // args.num_heads}), d_ff {sizes['d_ff']}, context "
        f"{args.context_length}, tokenizer {len(tokenizer)} tokens (EOS {eos}) -> {args.out}"
    )
    return args.out


if __name__ == "__main__":
    main()
